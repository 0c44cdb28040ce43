"""Several games played as one (id ``mix:A|B|C``), so that one policy learns them all.

SPIRAL (Liu et al. 2025, arXiv 2506.24119) trains one language model on TicTacToe, KuhnPoker and
SimpleNegotiation at once and finds the mixture transfers better than any one game. A league does
the same by playing the mix: every match is one of its parts, drawn from the match's seed by the
parts' weights (``mix:ta:TicTacToe-v0@2|ta:KuhnPoker-v0`` plays tic-tac-toe twice as often), so
a seed still names a whole game and replays it, and the planner knows each match's game before it
draws the opponents (matchmaking per game). The ledger records each match under its part's own
id with the same seed: the part alone, reset with that seed, is the very game that was played, so
replays, per-game ratings and per-game reports read a mix run's matches like any other game's.
Config key ``games:`` (league/config.py) writes the id.

The facts (`GameSpec`) cover every part: the widest action space (a part's actions are its own
ids, the rest masked), and its observation prefixed by the part's index, ``[k, *part obs
flattened, zero padding]``, so a net reads which game it plays and a text agent's view
(`MixTextView`) tells each observation as its part's own view does: an LM sees exactly the prompt
it would see in the part alone, and a snapshot trained on the mix plays any part by itself
(`plays`). Parts must agree on seats, teams, observation dtype and whether moves are text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ludus.games.core import Game, GameError, GameSpec, TextGameRecord

PREFIX = "mix"
_PARTS = "|"
_WEIGHT = "@"
_DRAW_KEY = 0x6D6978
"""Mixed into the seed for the part draw ("mix"), so the draw does not correlate with the part's
own use of the same seed."""


@dataclass(frozen=True)
class MixPart:
    """One game of a mix and its weight (its share of the matches is weight / total)."""

    game_id: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight) or self.weight <= 0:
            raise GameError(f"mix part {self.game_id!r}: weight must be a number > 0, got {self.weight!r}")
        if not isinstance(self.game_id, str) or not self.game_id.strip():
            raise GameError("a mix part needs a game id")
        if _PARTS in self.game_id or _WEIGHT in self.game_id:
            raise GameError(f"mix part {self.game_id!r}: a game id in a mix cannot hold '|' or '@'")
        if self.game_id.startswith(PREFIX + ":"):
            raise GameError(f"mix part {self.game_id!r}: a mix cannot hold another mix; list its games instead")


def format_mix(parts: tuple[MixPart, ...] | list[MixPart]) -> str:
    """The id of a mix: ``mix:A|B@2``, weights written only where not 1."""
    parts = tuple(parts)
    _check_parts(parts)
    return PREFIX + ":" + _PARTS.join(p.game_id + ("" if p.weight == 1 else f"{_WEIGHT}{p.weight:g}") for p in parts)


def parse_mix(rest: str) -> tuple[MixPart, ...]:
    """The parts of a mix id's rest (``A|B@2``); a one-line GameError on a malformed one."""
    parts = []
    for item in rest.split(_PARTS):
        game_id, sep, weight = item.strip().partition(_WEIGHT)
        if sep:
            try:
                value = float(weight)
            except ValueError:
                raise GameError(f"mix part {item!r}: the weight after '@' must be a number") from None
        else:
            value = 1.0
        parts.append(MixPart(game_id.strip(), value))
    parts = tuple(parts)
    _check_parts(parts)
    return parts


def _check_parts(parts: tuple[MixPart, ...]) -> None:
    if len(parts) < 2:
        raise GameError(f"a mix needs at least two games, got {len(parts)}: for one game, name it alone")
    ids = [p.game_id for p in parts]
    repeated = sorted({g for g in ids if ids.count(g) > 1})
    if repeated:
        raise GameError(f"a mix names {repeated[0]!r} twice: give it one entry with a larger weight")


def mix_parts(game_id: str) -> tuple[MixPart, ...]:
    """The parts of a mix id, () for any other id."""
    if not isinstance(game_id, str) or not game_id.startswith(PREFIX + ":"):
        return ()
    return parse_mix(game_id[len(PREFIX) + 1:])


def part_index(parts: tuple[MixPart, ...], seed: int) -> int:
    """Which part the match of `seed` plays: a draw by the weights from the seed alone."""
    weights = np.array([p.weight for p in parts], dtype=np.float64)
    u = np.random.default_rng([int(seed) & (2**64 - 1), _DRAW_KEY]).random()
    return int(min(np.searchsorted(np.cumsum(weights / weights.sum()), u, side="right"), len(parts) - 1))


def match_game_id(game_id: str, seed: int) -> str:
    """The game a match of `game_id` with `seed` plays: its part's id in a mix, else `game_id`."""
    parts = mix_parts(game_id)
    return parts[part_index(parts, seed)].game_id if parts else game_id


def part_of_observations(obs: np.ndarray) -> np.ndarray:
    """[N] the part index of each of N mix observations ([N, *observation_shape]): their first entry."""
    return np.asarray(obs).reshape(len(obs), -1)[:, 0].astype(np.int64)


def plays(trained_on: str, game_id: str) -> bool:
    """Whether a policy trained on `trained_on` plays `game_id`: the same game, or a part of its mix."""
    return game_id == trained_on or any(p.game_id == game_id for p in mix_parts(trained_on))


def mix_spec(game_id: str, specs: list[GameSpec]) -> GameSpec:
    """The facts of a mix of games with facts `specs` (see the module docstring)."""
    first = specs[0]
    for s in specs[1:]:
        for fact in ("num_players", "team_of_seat", "observation_dtype", "text_moves"):
            if getattr(s, fact) != getattr(first, fact):
                raise GameError(f"{game_id}: its games differ in {fact} ({first.id}: {getattr(first, fact)}, "
                                f"{s.id}: {getattr(s, fact)}); a mix holds games one policy can play in every seat")
    sums = {s.utility_sum for s in specs}
    zero_sum = all(s.zero_sum for s in specs) and len(sums) == 1
    lows = [s.observation_low for s in specs]
    highs = [s.observation_high for s in specs]
    return GameSpec(
        id=game_id, num_players=first.num_players, num_actions=max(s.num_actions for s in specs),
        observation_shape=(1 + max(int(np.prod(s.observation_shape)) for s in specs),),
        teams=first.teams, zero_sum=zero_sum, utility_sum=first.utility_sum if zero_sum else None,
        min_utility=min(s.min_utility for s in specs), max_utility=max(s.max_utility for s in specs),
        max_length=max(s.max_length for s in specs), simultaneous=any(s.simultaneous for s in specs),
        has_chance=True, perfect_information=all(s.perfect_information for s in specs),
        observation_dtype=first.observation_dtype,
        observation_low=None if None in lows else min(0.0, *lows),
        observation_high=None if None in highs else max(float(len(specs) - 1), *highs),
        text_moves=first.text_moves)


class MixGame:
    """A mix as a `Game` (and a `TextMoveGame` when its parts are): each reset plays the part
    its seed draws, reset with that same seed."""

    def __init__(self, rest: str):
        from ludus.games import registry

        self.parts = parse_mix(rest)
        self.games: list[Game] = [registry.make(p.game_id) for p in self.parts]
        self.spec = mix_spec(format_mix(self.parts), [g.spec for g in self.games])
        self.index = -1

    @property
    def current(self) -> Game:
        if self.index < 0:
            raise GameError(f"{self.spec.id}: call reset(seed) before playing")
        return self.games[self.index]

    def reset(self, seed: int) -> None:
        self.index = part_index(self.parts, seed)
        self.current.reset(int(seed))

    def to_move(self) -> tuple[int, ...]:
        return self.current.to_move()

    def observation(self, seat: int) -> np.ndarray:
        flat = np.asarray(self.current.observation(seat)).reshape(-1)
        out = np.zeros(self.spec.observation_shape, dtype=self.spec.observation_dtype)
        out[0] = self.index
        out[1:1 + len(flat)] = flat
        return out

    def legal_mask(self, seat: int) -> np.ndarray:
        mask = np.zeros(self.spec.num_actions, dtype=bool)
        own = self.current.legal_mask(seat)
        mask[:len(own)] = own
        return mask

    def step(self, actions: dict[int, int]) -> np.ndarray:
        return self.current.step(actions)

    def is_terminal(self) -> bool:
        return self.current.is_terminal()

    def is_truncated(self) -> bool:
        return self.current.is_truncated()

    def returns(self) -> np.ndarray:
        return self.current.returns()

    def history(self) -> tuple[int, ...]:
        return self.current.history()

    def render(self) -> str:
        if self.index < 0:
            return f"{self.spec.id} (not started)"
        return f"{self.parts[self.index].game_id}\n{self.current.render()}"

    # -- text moves (parts that are `TextMoveGame`s)

    def move_text(self, seat: int, action: int) -> str:
        return self.current.move_text(seat, action)

    def lists_moves(self) -> bool:
        return self.current.lists_moves()

    def text(self, seat: int) -> str:
        return self.current.text(seat)

    def step_text(self, moves: dict[int, str]) -> np.ndarray:
        return self.current.step_text(moves)

    def record(self) -> TextGameRecord:
        return self.current.record()


def make_mix_game(rest: str) -> MixGame:
    return MixGame(rest)


def mix_game_spec(rest: str) -> GameSpec:
    """The facts of ``mix:<rest>`` from its parts' facts (no part is stepped)."""
    from ludus.games import registry

    parts = parse_mix(rest)
    return mix_spec(format_mix(parts), [registry.spec(p.game_id) for p in parts])


def describe_layout(game: MixGame) -> list[str]:
    """`ludus games --describe` lines of a mix."""
    return [f"observation: [k, the observation of game k flattened, zero padding]; k indexes "
            f"{', '.join(f'{i} {p.game_id}' for i, p in enumerate(game.parts))}",
            f"actions: game k's own action ids (0-{game.spec.num_actions - 1}; those game k lacks are masked)",
            "each match plays the game its seed draws by the weights "
            + ", ".join(f"{p.game_id} {p.weight:g}" for p in game.parts)]


@dataclass(frozen=True)
class MixTextView:
    """A mix told in words: each observation as its own game's view tells it (`part`), so a text
    agent reads the same prompt as in that game alone (`ludus.games.text.told` resolves it)."""

    game_id: str
    title: str
    views: tuple[Any, ...]
    """Each part's `TextView`, in the mix's order."""
    shapes: tuple[tuple[tuple[int, ...], int], ...]
    """Each part's (observation shape, number of actions)."""

    def part(self, obs: np.ndarray, mask: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
        """(the view of the game `obs` belongs to, that game's own observation and mask)."""
        flat = np.asarray(obs).reshape(-1)
        k = int(flat[0])
        if not 0 <= k < len(self.views):
            raise GameError(f"{self.game_id}: observation names game {k}, the mix has {len(self.views)}")
        shape, actions = self.shapes[k]
        return self.views[k], flat[1:1 + int(np.prod(shape))].reshape(shape), np.asarray(mask)[..., :actions]

    def rules(self) -> str:
        return f"You play {self.title}; each game's messages tell its rules."

    def role(self, seat: int) -> str:
        return f"You are Player {seat}."

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        view, own, own_mask = self.part(obs, mask)
        return view.state(own, seat, own_mask)

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        view, own, own_mask = self.part(obs, mask)
        return dict(view.answers(own, seat, own_mask))

    def normal_form(self, answer: str) -> str:
        return answer


def mix_text_view(rest: str) -> MixTextView:
    """The text view of ``mix:<rest>``: every part needs one (a one-line error names the first that has none)."""
    from ludus.games.registry import spec
    from ludus.games.text import text_view

    parts = parse_mix(rest)
    views = tuple(text_view(p.game_id) for p in parts)
    specs = [spec(p.game_id) for p in parts]
    return MixTextView(format_mix(parts), " and ".join(v.title for v in views), views,
                       tuple((s.observation_shape, s.num_actions) for s in specs))
