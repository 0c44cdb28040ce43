"""The game protocol every part of Ludus plays through.

A game's facts are values (`GameSpec`); a running game is an object with a small
stateful interface (`Game`); many games stepped per call share one batched interface
(`VectorGame`). The design covers, from one shape:

* turn-based games: exactly one seat is in `to_move()` at a time;
* simultaneous moves (OpenSpiel goofspiel, PettingZoo Parallel envs): several seats act at once;
* chance: resolved inside the game from the seed given to `reset`, never by the caller;
* teams: `GameSpec.teams` gives each seat's team id (MAPPO, team-vs-team leagues);
* dialogue: a seat may stay in `to_move()` for several consecutive steps (one token each)
  before the turn passes.

Results are per (match, seat): `returns()` is a vector over seats, never a single "winner".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from ludus.errors import UserError


class GameError(UserError, ValueError):
    """Bad game id, bad parameter or illegal use of a game; the message says what to do."""


@dataclass(frozen=True)
class GameSpec:
    """Static facts about a game. Everything else in Ludus sizes itself from these values."""

    id: str
    """Registry id that rebuilds this game, e.g. ``connect_four`` or ``spiel:goofspiel(num_cards=4)``."""
    num_players: int
    """Number of seats."""
    num_actions: int
    """Size of the (discrete) action space shared by every seat."""
    observation_shape: tuple[int, ...]
    """Shape of the observation a seat receives (the same for every seat)."""
    teams: tuple[int, ...] = ()
    """Team id of each seat; empty means every seat is its own team (seat i is team i)."""
    zero_sum: bool = True
    """True when the returns of every finished game sum to `utility_sum`."""
    utility_sum: float | None = 0.0
    """The constant sum of final returns when `zero_sum`; None otherwise."""
    min_utility: float = -1.0
    """Lowest final return a seat can get."""
    max_utility: float = 1.0
    """Highest final return a seat can get."""
    max_length: int = 1000
    """Upper bound on the number of steps (calls to `step`) in one game; reaching it truncates."""
    simultaneous: bool = False
    """True when several seats may act in the same step."""
    has_chance: bool = False
    """True when the game draws random events (resolved inside from the reset seed)."""
    perfect_information: bool = True
    """False when seats see different things (poker, dialogue with private values)."""
    observation_dtype: str = "float32"
    """numpy dtype name of observations (float32 for boards; int64 for token games)."""
    state_shape: tuple[int, ...] | None = None
    """Shape of the global state (`Game.global_state`) for centralised critics; None if absent."""
    spiel_name: str | None = None
    """The pyspiel game string this game is equivalent to (same actions and returns), if any.

    Lets OpenSpiel tools (MCTS, exploitability) work on the game by replaying its history."""
    observation_low: float | None = None
    """Lowest value of any observation entry, if known (PettingZoo/Gymnasium exports bound their spaces by it)."""
    observation_high: float | None = None
    """Highest value of any observation entry, if known."""
    binary_observations: bool = False
    """Every observation entry is exactly 0 or 1 (boards as planes): trajectories store them as
    uint8, a quarter of float32's memory traffic."""
    text_moves: bool = False
    """Moves are text that the game itself judges (`TextMoveGame`): a text agent may answer in free
    text, and the game says when a move is invalid. Action ``a`` is then the game's listed answer
    ``move_text(seat, a)`` (what nets, bots and the random mover play), and a game with no list
    (free talk, offers) has one action, the empty move: only a text agent really plays it."""

    def __post_init__(self) -> None:
        if self.num_players < 1:
            raise GameError(f"game {self.id!r}: num_players must be >= 1, got {self.num_players}")
        if self.num_actions < 1:
            raise GameError(f"game {self.id!r}: num_actions must be >= 1, got {self.num_actions}")
        if self.teams and len(self.teams) != self.num_players:
            raise GameError(f"game {self.id!r}: teams has {len(self.teams)} entries for {self.num_players} seats")
        object.__setattr__(self, "observation_shape", tuple(int(d) for d in self.observation_shape))

    @property
    def team_of_seat(self) -> tuple[int, ...]:
        """Team id per seat, defaulting to one team per seat."""
        return self.teams if self.teams else tuple(range(self.num_players))

    @property
    def sides(self) -> tuple[tuple[int, ...], ...]:
        """Seats grouped by team, teams in order of first seat: what one player fills in a league,
        an evaluation or an arena match (one seat each where every seat is its own team)."""
        sides: dict[int, list[int]] = {}
        for seat, team in enumerate(self.team_of_seat):
            sides.setdefault(team, []).append(seat)
        return tuple(tuple(seats) for seats in sides.values())

    def to_json(self) -> dict:
        """A strictly JSON-safe dict (snapshot manifests store it): infinite bounds become the
        strings "inf" / "-inf", which strict JSON parsers (browsers, other languages) accept."""
        data = dataclasses.asdict(self)
        for key in _FLOAT_BOUNDS:
            value = data[key]
            if value is not None and not np.isfinite(value):
                data[key] = "inf" if value > 0 else "-inf"
        return data

    @staticmethod
    def from_json(data: dict) -> "GameSpec":
        fields = {f.name for f in dataclasses.fields(GameSpec)}
        unknown = set(data) - fields
        if unknown:
            raise GameError(f"GameSpec has no field(s) {sorted(unknown)}")
        data = dict(data)
        for key in _FLOAT_BOUNDS:
            if data.get(key) in ("inf", "-inf"):
                data[key] = float(data[key])
        for key in ("observation_shape", "teams", "state_shape"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return GameSpec(**data)


_FLOAT_BOUNDS = ("min_utility", "max_utility", "observation_low", "observation_high")


@runtime_checkable
class Game(Protocol):
    """One running game. Chance is resolved inside from the seed given to `reset`.

    Life cycle: ``reset(seed)``; then while not ``is_over()``: the seats in ``to_move()`` each
    read ``observation(seat)`` and ``legal_mask(seat)`` and ``step({seat: action, ...})`` is
    called with one action per acting seat. ``step`` returns the reward each seat received in
    that step (shape ``[num_players]``); ``returns()`` is their running sum.
    """

    spec: GameSpec

    def reset(self, seed: int) -> None: ...

    def to_move(self) -> tuple[int, ...]:
        """Seats that act in the next step, in increasing order; empty once the game is over."""
        ...

    def observation(self, seat: int) -> np.ndarray:
        """What `seat` sees now, shape `spec.observation_shape`."""
        ...

    def legal_mask(self, seat: int) -> np.ndarray:
        """Boolean mask over `spec.num_actions`; non-empty for every seat in `to_move()`."""
        ...

    def step(self, actions: dict[int, int]) -> np.ndarray:
        """Apply one action per acting seat; returns this step's rewards per seat."""
        ...

    def is_terminal(self) -> bool: ...

    def is_truncated(self) -> bool:
        """True when the game was cut short (step limit) rather than finished by its rules."""
        ...

    def returns(self) -> np.ndarray:
        """Sum of rewards per seat so far (the final returns once the game is over)."""
        ...

    def history(self) -> tuple[int, ...]:
        """Actions applied so far, in order (for simultaneous games: per step, seats in order).

        Chance outcomes are not included: they follow from the seed."""
        ...

    def render(self) -> str:
        """The position as text, for people (play, replays)."""
        ...


@runtime_checkable
class GlobalStateGame(Game, Protocol):
    """A game with a global state (`spec.state_shape` set): what a centralised critic reads
    (MAPPO, Yu et al. 2022), beyond any one seat's observation. `check_game` checks its shape."""

    def global_state(self) -> np.ndarray:
        """The whole state now, float32 of shape `spec.state_shape`."""
        ...


@runtime_checkable
class TextMoveGame(Game, Protocol):
    """A game whose moves are text judged by the game (`spec.text_moves`), as TextArena's are
    (Guertler et al. 2025): the game parses a move, applies its own rule to an invalid one (tell
    the seat why and let it move again, or end the match) and records every move's text, so a
    seeded game replays from its transcript."""

    def move_text(self, seat: int, action: int) -> str:
        """The text of listed action `action` for `seat` now; GameError when the game lists no
        moves (free text) or `action` is not legal."""
        ...

    def lists_moves(self) -> bool:
        """True when the state yields its legal moves (actions are then listed answers)."""
        ...

    def text(self, seat: int) -> str:
        """What `seat` has been told so far, as the game tells it (its observation, as text)."""
        ...

    def step_text(self, moves: dict[int, str]) -> np.ndarray:
        """Apply one text move per acting seat (judged by the game); returns this step's rewards.
        An invalid move is recorded and handled by the game's own rule, never raised."""
        ...

    def record(self) -> "TextGameRecord":
        """What this game has played so far: every move's text, invalid moves per seat, and the
        error that ended it, if the game itself failed."""
        ...


@dataclass(frozen=True)
class TextGameRecord:
    """The transcript of a text-move game (`TextMoveGame.record`)."""

    texts: tuple[str, ...] = ()
    """Every move's text, in the order played (invalid ones included: with the seed they replay it)."""
    invalid: tuple[int, ...] = ()
    """Per seat, the moves the game judged invalid."""
    error: str = ""
    """Why the game itself failed (an exception inside it): the match then ends with status
    'error' for every seat and no result; '' when it did not."""


def is_over(game: Game) -> bool:
    return game.is_terminal() or game.is_truncated()


FORFEIT_LOSS_UNKNOWN_BOUNDS = -1.0
"""A faulting seat's return in a game whose worst return is not known (an adapted game with no
recorded facts: infinite `min_utility`); the others then get its negation when the best return is
not known either. The ledger needs finite returns, and a forfeit must still read as a loss."""


def forfeit_returns(spec: GameSpec, faulted: Sequence[bool]) -> tuple[float, ...]:
    """Returns of a match that ended by forfeit.

    Faulting seats get `min_utility`. In zero-sum games the other seats share what the faulting
    seats lost, each getting ``(utility_sum - k * min_utility) / (P - k)`` clipped to
    `max_utility` (for two-player zero-sum games: the opponent wins, ``max_utility``); in other
    games they get `max_utility`. If every seat faulted, all get `min_utility`. Unknown (infinite)
    bounds are replaced by `FORFEIT_LOSS_UNKNOWN_BOUNDS` and its negation.
    """
    lo = float(spec.min_utility) if math.isfinite(spec.min_utility) else FORFEIT_LOSS_UNKNOWN_BOUNDS
    hi = float(spec.max_utility) if math.isfinite(spec.max_utility) else -FORFEIT_LOSS_UNKNOWN_BOUNDS
    k = sum(bool(f) for f in faulted)
    n = len(faulted)
    if k == n:
        return tuple(lo for _ in faulted)
    if spec.zero_sum and spec.utility_sum is not None:
        share = min(hi, (spec.utility_sum - k * lo) / (n - k))
    else:
        share = hi
    return tuple(lo if f else share for f in faulted)


@dataclass(frozen=True)
class TimeStep:
    """What a `VectorGame` returns after `reset`/`step` for B games.

    Observations and masks are per (game, seat); rows of seats that do not act are zeros and
    all-False. When a game ends in a step it is reset at once (auto-reset): `done[b]` is set,
    `final_returns[b]` holds the finished game's returns, `rewards[b]` its last rewards, and
    the observations already belong to the new game.
    """

    obs: np.ndarray
    """[B, P, *observation_shape] observation of each seat."""
    mask: np.ndarray
    """[B, P, A] bool legal actions of each seat; all False for seats not acting."""
    acting: np.ndarray
    """[B, P] bool: seat p acts in game b in the next step."""
    rewards: np.ndarray
    """[B, P] float32 rewards received in the last step (of the game that was running then)."""
    done: np.ndarray
    """[B] bool: the game in slot b ended in the last step (it is already reset)."""
    truncated: np.ndarray
    """[B] bool: that ending was a truncation (step limit), not a terminal state."""
    final_returns: np.ndarray
    """[B, P] float32 final returns of games that ended (zeros elsewhere)."""
    final_lengths: np.ndarray
    """[B] int64 number of steps of games that ended (zeros elsewhere)."""
    final_records: tuple["TextGameRecord | None", ...] | None = None
    """Text-move games only (`spec.text_moves`): per slot, the record of the game that ended in
    the last step (None in slots where none ended); None for other games."""


SeedSource = Callable[[int], np.ndarray]
"""Given n, returns n new game seeds (uint64). Lets the league give each new match its own seed."""


def counter_seed_source(seed: int) -> SeedSource:
    """Default seed source: seeds spawned from one SeedSequence, in order."""
    root = np.random.SeedSequence(seed)

    def next_seeds(n: int) -> np.ndarray:
        children = root.spawn(n)
        return np.array([c.generate_state(1, np.uint64)[0] for c in children], dtype=np.uint64)

    return next_seeds


class VectorGame(Protocol):
    """B games stepped per call, with auto-reset."""

    spec: GameSpec
    num_games: int
    seed_source: SeedSource
    """Where auto-reset draws the seeds of new games; callers may replace it."""

    def reset(self, seeds: Sequence[int] | np.ndarray) -> TimeStep: ...

    def step(self, actions: np.ndarray, texts: np.ndarray | None = None) -> TimeStep:
        """actions: [B, P] int; entries of seats that do not act are ignored. texts: text-move
        games only, an optional [B, P] object array of move texts; a seat's text, where given,
        is played instead of its action."""
        ...

    def history(self, b: int) -> tuple[int, ...]:
        """Actions applied so far in the game running in slot b."""
        ...

    def render(self, b: int) -> str: ...

    def global_states(self) -> np.ndarray:
        """[B, *spec.state_shape] float32 global state of the game now in each slot (after an
        auto-reset: the new game's); GameError when the game has none (`spec.state_shape` None)."""
        ...


def no_global_state(spec: GameSpec) -> GameError:
    return GameError(f"{spec.id} has no global state (spec.state_shape is None); a centralised critic "
                     f"reads the concatenated observations instead")


class LoopVectorGame:
    """The vector interface over any `Game`, by a Python loop (adapters use this)."""

    def __init__(self, make_game: Callable[[], Game], num_games: int, seed: int = 0):
        if num_games < 1:
            raise GameError(f"num_games must be >= 1, got {num_games}")
        self.games = [make_game() for _ in range(num_games)]
        self.spec = self.games[0].spec
        self.num_games = num_games
        self.seed_source: SeedSource = counter_seed_source(seed)
        self._lengths = np.zeros(num_games, dtype=np.int64)

    def _empty(self) -> TimeStep:
        spec, b, p = self.spec, self.num_games, self.spec.num_players
        return TimeStep(
            obs=np.zeros((b, p, *spec.observation_shape), dtype=spec.observation_dtype),
            mask=np.zeros((b, p, spec.num_actions), dtype=bool),
            acting=np.zeros((b, p), dtype=bool),
            rewards=np.zeros((b, p), dtype=np.float32),
            done=np.zeros(b, dtype=bool),
            truncated=np.zeros(b, dtype=bool),
            final_returns=np.zeros((b, p), dtype=np.float32),
            final_lengths=np.zeros(b, dtype=np.int64),
        )

    def _fill(self, ts: TimeStep, b: int) -> None:
        game = self.games[b]
        for seat in game.to_move():
            ts.obs[b, seat] = game.observation(seat)
            ts.mask[b, seat] = game.legal_mask(seat)
            ts.acting[b, seat] = True

    def reset(self, seeds: Sequence[int] | np.ndarray) -> TimeStep:
        seeds = np.asarray(seeds)
        if seeds.shape != (self.num_games,):
            raise GameError(f"reset needs {self.num_games} seeds, got shape {seeds.shape}")
        ts = self._empty()
        for b, game in enumerate(self.games):
            game.reset(int(seeds[b]))
            self._lengths[b] = 0
            self._fill(ts, b)
        return ts

    def step(self, actions: np.ndarray, texts: np.ndarray | None = None) -> TimeStep:
        actions = np.asarray(actions)
        if texts is not None and not self.spec.text_moves:
            raise GameError(f"{self.spec.id} takes actions, not text moves")
        ts = self._empty()
        records: list[TextGameRecord | None] | None = [None] * self.num_games if self.spec.text_moves else None
        ended: list[int] = []
        for b, game in enumerate(self.games):
            movers = game.to_move()
            if texts is not None and any(texts[b, s] is not None for s in movers):
                ts.rewards[b] = game.step_text({s: (texts[b, s] if texts[b, s] is not None
                                                    else game.move_text(s, int(actions[b, s]))) for s in movers})
            else:
                ts.rewards[b] = game.step({s: int(actions[b, s]) for s in movers})
            self._lengths[b] += 1
            if is_over(game):
                ended.append(b)
                ts.done[b] = True
                ts.truncated[b] = game.is_truncated() and not game.is_terminal()
                ts.final_returns[b] = game.returns()
                ts.final_lengths[b] = self._lengths[b]
                if records is not None:
                    records[b] = game.record()
        if records is not None:
            ts = dataclasses.replace(ts, final_records=tuple(records))
        if ended:
            seeds = self.seed_source(len(ended))
            for b, seed in zip(ended, seeds):
                self.games[b].reset(int(seed))
                self._lengths[b] = 0
        for b in range(self.num_games):
            self._fill(ts, b)
        return ts

    def history(self, b: int) -> tuple[int, ...]:
        return self.games[b].history()

    def record(self, b: int) -> TextGameRecord:
        """The record so far of the text-move game in slot b (a match that ends by forfeit)."""
        return self.games[b].record()

    def render(self, b: int) -> str:
        return self.games[b].render()

    def global_states(self) -> np.ndarray:
        if self.spec.state_shape is None:
            raise no_global_state(self.spec)
        return np.stack([game.global_state() for game in self.games]).astype(np.float32, copy=False)
