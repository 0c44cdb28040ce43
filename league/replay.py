"""Re-simulating a recorded match: seed + moves -> the same game, step by step.

The ledger stores a match's moves as its history: the actions applied, in order, with the
acting seats of a simultaneous step in seat order. Chance follows from the seed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from games.core import Game, forfeit_returns, is_over
from ludus.errors import UserError


class ReplayError(UserError):
    """Recorded moves that do not fit the game (illegal, too many or too few)."""


def replay_moves(game: Game, seed: int, moves: Sequence[int], header: str = "") -> tuple[np.ndarray, str]:
    """Play `moves` in `game` from `seed`; returns (final returns, a text transcript with boards)."""
    lines, position = replay_prefix(game, seed, moves, stop_when_over=True)
    if not is_over(game):
        raise ReplayError(f"the recorded moves end after {position} actions but the game is not over")
    if position != len(moves):
        raise ReplayError(f"the game ended after {position} of {len(moves)} recorded actions")
    returns = game.returns()
    lines.append(f"returns: {[float(r) for r in returns]}")
    return returns, "\n".join(([header] if header else []) + lines)


def replay_prefix(game: Game, seed: int, moves: Sequence[int], stop_when_over: bool = False) -> tuple[list[str], int]:
    """Apply recorded moves from `seed` (all of them, or until the game is over): the boards after
    each step as text lines, and how many moves were applied. Every move is checked for legality.
    A match cut short (a forfeit in the arena) replays its prefix with this."""
    game.reset(int(seed))
    lines = [game.render()]
    position = 0
    while position < len(moves) and not (stop_when_over and is_over(game)):
        movers = game.to_move()
        if not movers:
            raise ReplayError(f"the game ended after {position} of {len(moves)} recorded actions")
        if position + len(movers) > len(moves):
            raise ReplayError(f"the recorded moves end inside a step after {position} actions")
        actions = {}
        for seat in movers:
            action = int(moves[position])
            position += 1
            if not game.legal_mask(seat)[action]:
                raise ReplayError(f"recorded action {action} of seat {seat} at move {position} is illegal")
            actions[seat] = action
        game.step(actions)
        lines.append(f"-- {', '.join(f'seat {s} plays {a}' for s, a in actions.items())}")
        lines.append(game.render())
    return lines, position


def replay_forfeit(game: Game, seed: int, moves: Sequence[int], forfeited: Sequence[bool],
                   header: str = "") -> tuple[tuple[float, ...], str]:
    """Replay a match that ended by forfeit (`forfeited`: per seat): its moves are the prefix of a
    game that is not over; returns (the returns the forfeit rule gives, a transcript)."""
    lines, _ = replay_prefix(game, seed, moves)
    if is_over(game):
        raise ReplayError(f"the match is recorded as a forfeit but its {len(moves)} moves finish the game")
    returns = forfeit_returns(game.spec, forfeited)
    lines += [f"seat {s} forfeits" for s, f in enumerate(forfeited) if f]
    lines.append(f"returns (by forfeit): {list(returns)}")
    return returns, "\n".join(([header] if header else []) + lines)
