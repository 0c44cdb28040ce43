"""`check_game`: does a game keep the Ludus game protocol? (In the spirit of PettingZoo's api_test.)

It plays seeded random legal games and asserts, with a message naming the seed and step:

* the spec is sane, survives a JSON round trip, and its id rebuilds the same game;
* every acting seat gets an observation of `spec.observation_shape`/`observation_dtype` and a
  non-empty boolean mask over `spec.num_actions`; a game that is not simultaneous moves one seat
  at a time; once over, nobody is to move;
* every game ends (terminal, or truncated) within `spec.max_length` steps;
* each step's rewards sum to `returns()`, and `history()` lists exactly the actions applied;
* terminal returns sum to `utility_sum` in zero-sum games and lie in [min_utility, max_utility];
* arrays handed out are not modified afterwards (callers may keep them);
* the same seed gives the same trajectory (observations, masks, rewards, history), on a fresh
  instance and on a reused one;
* `registry.make_vector(id, B)` equals B single games stepped by hand with the same seeds and
  actions, through auto-resets (done, truncated, final returns and lengths, the new games'
  observations). Auto-reset seeds come from `seed_source`, drawn for finished slots in
  increasing slot order;
* `global_state()` has `spec.state_shape` where set, and the vector game's `global_states()`
  equals the single games' states;
* `render()` returns text;
* text-move games (`spec.text_moves`) are also played by text: legal answers as text, bracketed
  phrases the observation shows, and junk the game must judge invalid, never raise on; the
  record lists every move's text, and a fresh game replaying those texts from the seed reaches
  the same returns.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ludus.games import registry
import re

from ludus.games.core import Game, GameSpec, GlobalStateGame, TextMoveGame, TimeStep, counter_seed_source, is_over

REWARD_TOLERANCE = 1e-4
"""Absolute tolerance when comparing sums of float32 rewards with returns."""


class GameCheckError(AssertionError):
    """The game breaks the protocol; the message says where (seed, step) and how."""


@dataclass(frozen=True)
class CheckReport:
    """What `check_game` verified for one game id."""

    game_id: str
    """The id that was checked."""
    spec: GameSpec
    """The game's spec."""
    num_games: int
    """Random legal games played to the end."""
    num_steps: int
    """Steps over those games."""
    num_terminal: int
    """Games that ended by the rules."""
    num_truncated: int
    """Games cut at the step limit."""
    longest_game: int
    """Steps of the longest game played."""
    replayed_games: int
    """Seeds replayed (fresh and reused instance) and found identical."""
    vector_games: int
    """B of the `make_vector` comparison."""
    vector_steps: int
    """Batched steps compared with single games."""
    vector_resets: int
    """Auto-resets compared."""
    seconds: float
    """Wall time of the check."""
    checks: tuple[str, ...] = field(default=())
    """The properties that held."""
    num_failed: int = 0
    """Text-move games that the game itself ended with an error (it raised or hung): recorded,
    never a crash, but a game that fails every time is not really played."""

    def summary(self) -> str:
        lines = [
            f"{self.game_id}: OK in {self.seconds:.2f} s",
            f"  {self.num_games} random games, {self.num_steps} steps ({self.num_terminal} terminal, "
            f"{self.num_truncated} truncated, longest {self.longest_game} of max_length {self.spec.max_length})",
            f"  {self.replayed_games} seeds replayed identically; make_vector B={self.vector_games}: "
            f"{self.vector_steps} steps, {self.vector_resets} auto-resets matched",
        ]
        lines += [f"  ok  {check}" for check in self.checks]
        return "\n".join(lines)


CHECKS = (
    "spec is sane, JSON round-trips and its id rebuilds the game",
    "acting seats get observations of the spec's shape and dtype and non-empty bool masks",
    "one mover per step unless simultaneous; no movers once over",
    "every game ends within max_length steps",
    "step rewards sum to returns(); history() is the actions applied",
    "terminal returns are within [min_utility, max_utility] and sum to utility_sum when zero-sum",
    "returned arrays are not modified afterwards",
    "same seed, same trajectory (fresh and reused instance)",
    "make_vector equals single games stepped by hand, through auto-resets",
    "render() returns text",
)


@dataclass
class _Trajectory:
    """One played game, for comparisons."""

    movers: list[tuple[int, ...]] = field(default_factory=list)
    observations: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    rewards: list[np.ndarray] = field(default_factory=list)
    history: tuple[int, ...] = ()
    returns: np.ndarray | None = None
    terminal: bool = False
    truncated: bool = False
    failed: bool = False
    """A text-move game that ended with its own error (`TextGameRecord.error`)."""


def _fail(game_id: str, where: str, problem: str) -> GameCheckError:
    return GameCheckError(f"check_game({game_id!r}) {where}: {problem}")


def _check_spec(game_id: str, spec: GameSpec) -> None:
    def need(ok: bool, problem: str) -> None:
        if not ok:
            raise _fail(game_id, "spec", problem)

    need(isinstance(spec, GameSpec), f"game.spec is a {type(spec).__name__}, not a GameSpec")
    need(all(isinstance(d, int) and d > 0 for d in spec.observation_shape),
         f"observation_shape {spec.observation_shape} must be positive ints")
    try:
        np.dtype(spec.observation_dtype)
    except TypeError:
        need(False, f"observation_dtype {spec.observation_dtype!r} is not a numpy dtype")
    need(spec.max_length >= 1, f"max_length {spec.max_length} must be >= 1")
    need(spec.min_utility <= spec.max_utility,
         f"min_utility {spec.min_utility} > max_utility {spec.max_utility}")
    need(spec.zero_sum == (spec.utility_sum is not None),
         f"zero_sum={spec.zero_sum} but utility_sum={spec.utility_sum} (set it exactly when zero-sum)")
    need(spec.state_shape is None or all(isinstance(d, int) and d > 0 for d in spec.state_shape),
         f"state_shape {spec.state_shape} must be None or positive ints")
    round_trip = GameSpec.from_json(json.loads(json.dumps(spec.to_json())))
    need(round_trip == spec, f"spec changes through JSON: {round_trip} != {spec}")
    rebuilt = registry.make(spec.id).spec
    need(rebuilt == spec, f"spec.id {spec.id!r} rebuilds a different game: {rebuilt}")


def _random_action(mask: np.ndarray, rng: np.random.Generator) -> int:
    legal = np.flatnonzero(mask)
    return int(legal[rng.integers(len(legal))])


_PHRASE = re.compile(r"\[[^\[\]\n]{1,60}\]")
_JUNK = ("", "[zzz]", "hello", "[ ]", "[[]]", "\u202e[0]", "[" + "9" * 40 + "]")


def _text_move(game: TextMoveGame, seat: int, mask: np.ndarray, rng: np.random.Generator) -> tuple[int, str | None]:
    """What the checker's text agent plays: (action, None) to play an action, or (-1, text): a
    listed answer as text, a bracketed phrase the seat's text shows (games state their move
    formats so), or junk the game must judge invalid."""
    roll = rng.random()
    if game.lists_moves():
        if roll < 0.6:
            return _random_action(mask, rng), None
        if roll < 0.9:
            return -1, game.move_text(seat, _random_action(mask, rng))
        return -1, _JUNK[int(rng.integers(len(_JUNK)))]
    if roll < 0.1:
        return -1, _JUNK[int(rng.integers(len(_JUNK)))]
    seen = _PHRASE.findall(game.text(seat)) or list(_JUNK)
    return -1, seen[int(rng.integers(len(seen)))]


def _play(game_id: str, game: Game, seed: int, rng: np.random.Generator) -> _Trajectory:
    """Play one random legal game, checking every step."""
    spec = game.spec
    shape, dtype = spec.observation_shape, np.dtype(spec.observation_dtype)
    num_players, num_actions = spec.num_players, spec.num_actions
    traj = _Trajectory()
    kept: list[tuple[np.ndarray, np.ndarray]] = []  # (array handed out, our copy)
    game.reset(seed)

    def fail(step: int, problem: str) -> GameCheckError:
        return _fail(game_id, f"seed {seed}, step {step}", problem)

    if not isinstance(game.render(), str):
        raise fail(0, f"render() returned {type(game.render()).__name__}, not str")
    running = np.zeros(num_players, dtype=np.float64)
    if not np.allclose(game.returns(), 0.0):
        raise fail(0, f"returns() right after reset is {game.returns()}, not zeros")
    applied: list[int] = []
    step = 0
    while True:
        movers = game.to_move()
        if not isinstance(movers, tuple) or any(not isinstance(s, (int, np.integer)) for s in movers):
            raise fail(step, f"to_move() must return a tuple of ints, got {movers!r}")
        if list(movers) != sorted(set(movers)) or any(not 0 <= s < num_players for s in movers):
            raise fail(step, f"to_move() {movers} must be distinct seats in 0..{num_players - 1}, increasing")
        if is_over(game):
            if movers:
                raise fail(step, f"the game is over but to_move() is {movers}")
            break
        if not movers:
            raise fail(step, "nobody is to move but the game is neither terminal nor truncated")
        if len(movers) > 1 and not spec.simultaneous:
            raise fail(step, f"seats {movers} move at once but spec.simultaneous is False")
        if step >= spec.max_length:
            raise fail(step, f"the game is still running after max_length={spec.max_length} steps; "
                             f"truncate it (is_truncated) or raise max_length")
        if step == 0 and spec.state_shape is not None:
            if not isinstance(game, GlobalStateGame):
                raise fail(step, "spec.state_shape is set but the game has no global_state() method")
            state = game.global_state()
            if np.shape(state) != spec.state_shape:
                raise fail(step, f"global_state() has shape {np.shape(state)}, spec.state_shape is {spec.state_shape}")
        actions: dict[int, int] = {}
        texts: dict[int, str] = {}
        for seat in movers:
            obs = game.observation(seat)
            mask = game.legal_mask(seat)
            if not isinstance(obs, np.ndarray) or obs.shape != shape or obs.dtype != dtype:
                got = (obs.shape, obs.dtype) if isinstance(obs, np.ndarray) else type(obs).__name__
                raise fail(step, f"seat {seat} observation is {got}, spec says {shape} {dtype}")
            if spec.binary_observations and not np.isin(obs, (0, 1)).all():
                raise fail(step, f"seat {seat} observation has entries other than 0 and 1, "
                                 f"but the spec says binary_observations")
            if not isinstance(mask, np.ndarray) or mask.shape != (num_actions,) or mask.dtype != np.bool_:
                got = (mask.shape, mask.dtype) if isinstance(mask, np.ndarray) else type(mask).__name__
                raise fail(step, f"seat {seat} legal mask is {got}, must be bool ({num_actions},)")
            if not mask.any():
                raise fail(step, f"seat {seat} is to move but its legal mask is empty")
            kept.append((obs, obs.copy()))
            kept.append((mask, mask.copy()))
            traj.observations.append(obs.copy())
            traj.masks.append(mask.copy())
            if spec.text_moves:
                actions[seat], text = _text_move(game, seat, mask, rng)  # type: ignore[arg-type]
                if text is not None:
                    texts[seat] = text
            else:
                actions[seat] = _random_action(mask, rng)
        try:
            rewards = game.step_text(texts) if texts else game.step(actions)  # type: ignore[attr-defined]
        except Exception as exc:
            raise fail(step, f"{'step_text' if texts else 'step'}() raised {type(exc).__name__}: {exc}; "
                             f"a game judges its moves and never raises on one") from None
        step += 1
        if not isinstance(rewards, np.ndarray) or rewards.shape != (num_players,):
            raise fail(step, f"step() must return rewards of shape ({num_players},), got {rewards!r}")
        if not np.all(np.isfinite(rewards)):
            raise fail(step, f"step() returned non-finite rewards {rewards}")
        running += rewards
        if not np.allclose(game.returns(), running, atol=REWARD_TOLERANCE):
            raise fail(step, f"returns() {game.returns()} != sum of step rewards {running}")
        applied.extend(actions[s] for s in movers)
        traj.movers.append(movers)
        traj.rewards.append(np.array(rewards, copy=True))
    if game.history() != tuple(applied):
        raise fail(step, f"history() {game.history()} != actions applied {tuple(applied)}")
    if spec.text_moves:
        _check_record(game_id, game, seed, step, fail)  # type: ignore[arg-type]
    for handed_out, copy in kept:
        if not np.array_equal(handed_out, copy):
            raise fail(step, "an observation or mask returned earlier was modified later; "
                             "return a fresh array each time")
    returns = np.asarray(game.returns(), dtype=np.float64)
    if game.is_terminal():
        if spec.zero_sum and abs(returns.sum() - spec.utility_sum) > REWARD_TOLERANCE:
            raise fail(step, f"returns {returns} sum to {returns.sum()}, spec.utility_sum is {spec.utility_sum}")
        if np.any(returns < spec.min_utility - REWARD_TOLERANCE) or np.any(returns > spec.max_utility + REWARD_TOLERANCE):
            raise fail(step, f"returns {returns} leave [min_utility, max_utility] = "
                             f"[{spec.min_utility}, {spec.max_utility}]")
    if not isinstance(game.render(), str):
        raise fail(step, f"render() returned {type(game.render()).__name__}, not str")
    traj.history = game.history()
    traj.returns = returns
    traj.terminal = game.is_terminal()
    traj.truncated = game.is_truncated()
    traj.failed = bool(spec.text_moves and game.record().error)  # type: ignore[attr-defined]
    return traj


def _check_record(game_id: str, game: TextMoveGame, seed: int, steps: int, fail) -> None:
    """The record of a finished text-move game lists every move, and replays from the seed."""
    record = game.record()
    if len(record.texts) != steps:
        raise fail(steps, f"record() lists {len(record.texts)} move texts for {steps} steps")
    if len(record.invalid) != game.spec.num_players or sum(record.invalid) > steps:
        raise fail(steps, f"record().invalid {record.invalid} is not one count per seat within {steps} steps")
    replay = registry.make(game_id)
    replay.reset(seed)
    for text in record.texts:
        if is_over(replay):
            raise fail(steps, "replaying the recorded texts from the seed ends the game early")
        replay.step_text({replay.to_move()[0]: text})  # type: ignore[attr-defined]
    if not np.array_equal(replay.returns(), game.returns()) or replay.record() != record:
        raise fail(steps, f"replaying the recorded texts from the seed gives returns {replay.returns()} and a "
                          f"different record, not {game.returns()}")


def _same(a: _Trajectory, b: _Trajectory) -> str | None:
    """None when two trajectories are identical, else what differs first."""
    if a.movers != b.movers:
        return f"movers differ: {a.movers} vs {b.movers}"
    for name in ("observations", "masks", "rewards"):
        for t, (x, y) in enumerate(zip(getattr(a, name), getattr(b, name))):
            if not np.array_equal(x, y):
                return f"{name} differ at entry {t}"
    if a.history != b.history:
        return f"history differs: {a.history} vs {b.history}"
    if not np.array_equal(a.returns, b.returns) or (a.terminal, a.truncated) != (b.terminal, b.truncated):
        return f"results differ: {a.returns} vs {b.returns}"
    return None


def _action_rng(seed: int) -> np.random.Generator:
    # The random player's choices depend on the game seed only, so a replay repeats them.
    return np.random.default_rng([int(seed), 0x10D05])


def _expected_row(game: Game, spec: GameSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    obs = np.zeros((spec.num_players, *spec.observation_shape), dtype=spec.observation_dtype)
    mask = np.zeros((spec.num_players, spec.num_actions), dtype=bool)
    acting = np.zeros(spec.num_players, dtype=bool)
    for seat in game.to_move():
        obs[seat], mask[seat], acting[seat] = game.observation(seat), game.legal_mask(seat), True
    return obs, mask, acting


def _check_timestep_layout(game_id: str, ts: TimeStep, spec: GameSpec, b: int, where: str) -> None:
    p, a = spec.num_players, spec.num_actions
    expected = {
        "obs": ((b, p, *spec.observation_shape), np.dtype(spec.observation_dtype)),
        "mask": ((b, p, a), np.dtype(bool)),
        "acting": ((b, p), np.dtype(bool)),
        "rewards": ((b, p), np.dtype(np.float32)),
        "done": ((b,), np.dtype(bool)),
        "truncated": ((b,), np.dtype(bool)),
        "final_returns": ((b, p), np.dtype(np.float32)),
        "final_lengths": ((b,), np.dtype(np.int64)),
    }
    for name, (shape, dtype) in expected.items():
        value = getattr(ts, name)
        if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype != dtype:
            got = (value.shape, value.dtype) if isinstance(value, np.ndarray) else type(value).__name__
            raise _fail(game_id, where, f"TimeStep.{name} is {got}, must be {shape} {dtype}")


def _check_vector(game_id: str, spec: GameSpec, num_games: int, seeds: Sequence[int]) -> tuple[int, int]:
    """Compare make_vector with single games stepped by hand; returns (steps, auto-resets)."""
    vec = registry.make_vector(game_id, num_games, seed=0)
    if vec.spec != spec or vec.num_games != num_games:
        raise _fail(game_id, "make_vector", f"vector spec/num_games {vec.spec}/{vec.num_games} differ from "
                                            f"{spec}/{num_games}")
    drawn: list[int] = []
    source = counter_seed_source(0x5EED)

    def recording_source(n: int) -> np.ndarray:
        new = source(n)
        drawn.extend(int(s) for s in new)
        return new

    vec.seed_source = recording_source
    singles = [registry.make(game_id) for _ in range(num_games)]
    lengths = [0] * num_games
    finished = [0] * num_games
    rng = np.random.default_rng(0x10D05)
    start = np.array([int(s) for s in seeds[:num_games]], dtype=np.uint64)
    ts = vec.reset(start)
    for b, game in enumerate(singles):
        game.reset(int(start[b]))
    step, resets, used = 0, 0, 0
    while True:
        where = f"make_vector step {step}"
        _check_timestep_layout(game_id, ts, spec, num_games, where)
        for b, game in enumerate(singles):
            obs, mask, acting = _expected_row(game, spec)
            for name, got, want in (("acting", ts.acting[b], acting), ("mask", ts.mask[b], mask),
                                    ("obs", ts.obs[b], obs)):
                if not np.array_equal(got, want):
                    raise _fail(game_id, f"{where}, slot {b}", f"TimeStep.{name} differs from the single game's")
            if vec.history(b) != game.history():
                raise _fail(game_id, f"{where}, slot {b}", f"history {vec.history(b)} != {game.history()}")
        if spec.state_shape is not None:
            states = vec.global_states()
            for b, game in enumerate(singles):
                if not np.array_equal(states[b], np.asarray(game.global_state(), np.float32)):  # type: ignore[attr-defined]
                    raise _fail(game_id, f"{where}, slot {b}", "global_states() differs from the single game's")
        if min(finished) >= 2:
            break
        if step > 2 * spec.max_length + 2:
            raise _fail(game_id, where, f"slots finished {finished} games after {step} steps; "
                                        f"every game should end within max_length={spec.max_length}")
        # Entries of seats that do not act are arbitrary: the protocol says they are ignored.
        actions = rng.integers(0, spec.num_actions, size=(num_games, spec.num_players))
        for b in range(num_games):
            for seat in np.flatnonzero(ts.acting[b]):
                actions[b, seat] = _random_action(ts.mask[b, seat], rng)
        before = len(drawn)
        ts = vec.step(actions)
        step += 1
        where = f"make_vector step {step}"
        ended = []
        for b, game in enumerate(singles):
            rewards = game.step({s: int(actions[b, s]) for s in game.to_move()})
            lengths[b] += 1
            if not np.allclose(ts.rewards[b], rewards, atol=REWARD_TOLERANCE):
                raise _fail(game_id, f"{where}, slot {b}", f"rewards {ts.rewards[b]} != single game's {rewards}")
            over = is_over(game)
            truncated = game.is_truncated() and not game.is_terminal()
            if bool(ts.done[b]) != over or bool(ts.truncated[b]) != (over and truncated):
                raise _fail(game_id, f"{where}, slot {b}", f"done/truncated {ts.done[b]}/{ts.truncated[b]} != "
                                                           f"single game's {over}/{over and truncated}")
            want_returns = game.returns() if over else np.zeros(spec.num_players, np.float32)
            if not np.allclose(ts.final_returns[b], want_returns, atol=REWARD_TOLERANCE):
                raise _fail(game_id, f"{where}, slot {b}", f"final_returns {ts.final_returns[b]} != {want_returns}")
            if int(ts.final_lengths[b]) != (lengths[b] if over else 0):
                raise _fail(game_id, f"{where}, slot {b}", f"final_lengths {ts.final_lengths[b]} != "
                                                           f"{lengths[b] if over else 0}")
            if over:
                ended.append(b)
        if len(drawn) - before != len(ended):
            raise _fail(game_id, where, f"auto-reset drew {len(drawn) - before} seeds from seed_source for "
                                        f"{len(ended)} finished games")
        for b in ended:  # finished slots take the new seeds in increasing slot order
            singles[b].reset(drawn[used])
            used += 1
            lengths[b] = 0
            finished[b] += 1
            resets += 1
    for b in range(num_games):
        if not isinstance(vec.render(b), str):
            raise _fail(game_id, f"make_vector slot {b}", "render(b) must return str")
    return step, resets


def check_game(game_id: str, num_games: int = 100, seeds: Sequence[int] | None = None,
               num_vector_games: int = 3, num_replays: int = 5) -> CheckReport:
    """Check `game_id` against the game protocol; raises GameCheckError on the first violation.

    seeds: the game seeds to play (default: `num_games` 64-bit seeds from SeedSequence(0), so
    adapters are tried with full-width seeds). num_vector_games: B of the make_vector comparison.
    num_replays: how many of the seeds are replayed to test determinism.
    """
    started = time.perf_counter()
    game = registry.make(game_id)  # a bad id raises GameError, a UserError
    spec = game.spec
    _check_spec(game_id, spec)
    if seeds is None:
        seeds = [int(s) for s in counter_seed_source(0)(num_games)]
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("check_game needs at least one seed")
    trajectories = []
    for seed in seeds:
        trajectories.append(_play(game_id, game, seed, _action_rng(seed)))
    replay_seeds = seeds[:num_replays]
    fresh = registry.make(game_id)
    for seed, original in zip(replay_seeds, trajectories):
        for label, instance in (("a fresh instance", fresh), ("the reused instance", game)):
            difference = _same(original, _play(game_id, instance, seed, _action_rng(seed)))
            if difference:
                raise _fail(game_id, f"seed {seed}", f"replaying the seed on {label} gives a different "
                                                     f"trajectory ({difference}); draw all randomness "
                                                     f"from the reset seed")
    vector_seeds = seeds[:num_vector_games] if len(seeds) >= num_vector_games else \
        [int(s) for s in counter_seed_source(1)(num_vector_games)]
    vector_steps, vector_resets = _check_vector(game_id, spec, num_vector_games, vector_seeds)
    lengths = [len(t.rewards) for t in trajectories]
    return CheckReport(
        game_id=game_id,
        spec=spec,
        num_games=len(trajectories),
        num_steps=sum(lengths),
        num_terminal=sum(t.terminal for t in trajectories),
        num_truncated=sum(t.truncated and not t.terminal for t in trajectories),
        longest_game=max(lengths),
        replayed_games=len(replay_seeds),
        vector_games=num_vector_games,
        vector_steps=vector_steps,
        vector_resets=vector_resets,
        seconds=time.perf_counter() - started,
        checks=CHECKS,
        num_failed=sum(t.failed for t in trajectories),
    )
