"""`teams(game=ID)`: a two-player turn-based game played by two teams of two.

Seats 0 and 2 are team 0 and play base player 0's moves, seats 1 and 3 are team 1 and play base
player 1's; a team's members take its turns in turn (seat 0 makes player 0's first move, seat 2
its second, seat 0 its third, ...), as in team variants of board games where partners alternate
at the board without conferring. Every seat sees what its base player sees; both members of a
team get the team's return. `teams(game=connect_four)` is 2v2 connect four. The base game is any
registered two-player game whose moves alternate (no simultaneous moves); its id must not contain
a comma (the id's parameters are comma-separated).
"""

from __future__ import annotations

import numpy as np

from ludus.games.core import GameError, GameSpec
from ludus.games.registry import GameEntry

SEATS = 4
TEAMS = (0, 1, 0, 1)


class TeamsOfTwo:
    """The 2v2 game over a two-player base game (see the module docstring)."""

    def __init__(self, game: str = "connect_four"):
        from ludus.games.registry import make

        if not isinstance(game, str) or "," in game:
            raise GameError(f"teams(game=...) names one two-player game id without commas, got {game!r}")
        self.base = make(game)
        base = self.base.spec
        if base.num_players != 2 or base.simultaneous:
            raise GameError(f"teams(game={game}) needs a two-player game with alternating moves; {base.id} has "
                            f"{base.num_players} players{' and simultaneous moves' if base.simultaneous else ''}")
        self.spec = GameSpec(
            id=f"teams(game={base.id})", num_players=SEATS, num_actions=base.num_actions,
            observation_shape=base.observation_shape, teams=TEAMS, zero_sum=base.zero_sum,
            utility_sum=None if base.utility_sum is None else 2 * base.utility_sum,
            min_utility=base.min_utility, max_utility=base.max_utility, max_length=base.max_length,
            has_chance=base.has_chance, perfect_information=base.perfect_information,
            observation_dtype=base.observation_dtype, observation_low=base.observation_low,
            observation_high=base.observation_high, binary_observations=base.binary_observations)
        self._moves = [0, 0]

    def reset(self, seed: int) -> None:
        self.base.reset(seed)
        self._moves = [0, 0]

    def _seat_of(self, player: int) -> int:
        return player + 2 * (self._moves[player] % 2)

    def to_move(self) -> tuple[int, ...]:
        return tuple(self._seat_of(p) for p in self.base.to_move())

    def observation(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        return self.base.observation(seat % 2)

    def legal_mask(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        if seat not in self.to_move():
            return np.zeros(self.spec.num_actions, dtype=bool)
        return self.base.legal_mask(seat % 2)

    def step(self, actions: dict[int, int]) -> np.ndarray:
        movers = self.to_move()
        if set(actions) != set(movers):
            raise GameError(f"seats {list(movers)} are to move in {self.spec.id}; got actions for {sorted(actions)}")
        (seat,) = movers
        rewards = self.base.step({seat % 2: int(actions[seat])})
        self._moves[seat % 2] += 1
        return np.tile(np.asarray(rewards, dtype=np.float32), 2)

    def is_terminal(self) -> bool:
        return self.base.is_terminal()

    def is_truncated(self) -> bool:
        return self.base.is_truncated()

    def returns(self) -> np.ndarray:
        return np.tile(np.asarray(self.base.returns(), dtype=np.float32), 2)

    def history(self) -> tuple[int, ...]:
        return self.base.history()

    def render(self) -> str:
        movers = self.to_move()
        turn = f"seat {movers[0]} (team {movers[0] % 2}) to move" if movers else "over"
        return f"{self.base.render()}\n{turn}"

    def _check_seat(self, seat: int) -> None:
        if seat not in range(SEATS):
            raise GameError(f"{self.spec.id} has seats 0-3, got {seat}")


TEAMS_ENTRY = GameEntry(
    "teams", TeamsOfTwo, None,
    "A two-player game played 2v2: seats 0 and 2 (team 0) alternate at base player 0's moves, seats 1 and 3 "
    "at player 1's; teams(game=connect_four)",
    layout="observation: the base game's observation of the seat's base player (seat % 2); "
           "`ludus games --describe GAME` tells the base game's layout.\n"
           "actions: the base game's actions.\n"
           "seat 0 moves first, then 1, 2, 3, 0, ...; both members of a team get the team's return.")
