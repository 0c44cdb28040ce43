"""A person plays any registered game in the terminal against a bot or a snapshot.

The board is drawn with `Game.render()`, the legal action numbers are listed, and the person
types one. Input and output go through `input_fn`/`print_fn`, so tests drive a whole game with
scripted input. End of input (Ctrl-D) leaves cleanly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from agents.policy import ActBatch, Policy
from games.core import Game, GameSpec, is_over
from ludus.errors import UserError


class PlayError(UserError, ValueError):
    """A bad `ludus play` request (seat, opponent)."""


@dataclass(frozen=True)
class PlayResult:
    """How a terminal game ended."""

    finished: bool
    """False when the person left (end of input) before the game was over."""
    returns: tuple[float, ...]
    """Returns per seat (so far, if not finished)."""
    history: tuple[int, ...]
    """Actions applied, in order."""
    human_seat: int


def resolve_opponent(text: str, spec: GameSpec) -> Policy:
    """`--against`: an existing directory is a snapshot (it must be of this game); anything else a bot name."""
    if os.path.isdir(text):
        from agents.snapshot import policy_from_snapshot

        return policy_from_snapshot(text, expect_game=spec.id)
    from agents.bots import make_bot

    return make_bot(text, spec)


def _opponent_action(opponent: Policy, game: Game, seat: int, rng: np.random.Generator) -> int:
    batch = ActBatch(
        obs=game.observation(seat)[None],
        mask=game.legal_mask(seat)[None],
        seats=np.array([seat], dtype=np.int64),
        histories=[game.history()] if opponent.needs_history else None,
    )
    return int(opponent.act(batch, rng).actions[0])


def _ask_action(game: Game, seat: int, input_fn: Callable[[str], str], print_fn: Callable[..., None]) -> int:
    legal = np.flatnonzero(game.legal_mask(seat)).tolist()
    print_fn(f"Legal moves: {' '.join(str(a) for a in legal)}")
    while True:
        text = input_fn(f"seat {seat}, your move> ").strip()  # EOFError propagates: the person left
        try:
            action = int(text)
        except ValueError:
            print_fn(f"{text!r} is not a number; type one of: {' '.join(str(a) for a in legal)}")
            continue
        if action not in legal:
            print_fn(f"{action} is not a legal move; type one of: {' '.join(str(a) for a in legal)}")
            continue
        return action


def _verdict(returns: np.ndarray, seat: int) -> str:
    mine, others = returns[seat], np.delete(returns, seat)
    if len(others) == 0:
        return f"Game over: you scored {mine:g}."
    if mine > others.max():
        return f"Game over: you won ({mine:g})."
    if mine < others.max():
        return f"Game over: you lost ({mine:g})."
    return f"Game over: a draw ({mine:g})."


def play_terminal(game_id: str, opponent: Policy | str, human_seat: int = 0, seed: int = 0,
                  input_fn: Callable[[str], str] = input, print_fn: Callable[..., None] = print) -> PlayResult:
    """Play one game of `game_id` at `human_seat`; `opponent` (a Policy, bot name or snapshot path)
    takes every other seat. `seed` fixes the game's chance and the opponent's sampling."""
    from games import registry

    game = registry.make(game_id)
    spec = game.spec
    if not 0 <= human_seat < spec.num_players:
        raise PlayError(f"--seat {human_seat} does not exist in {game_id!r}: use 0..{spec.num_players - 1}")
    if isinstance(opponent, str):
        opponent = resolve_opponent(opponent, spec)
    rng = np.random.default_rng(seed)
    game.reset(seed)
    print_fn(f"{game_id}: you are seat {human_seat} of {spec.num_players}. Type a move number; Ctrl-D quits.")
    if not spec.perfect_information:
        # Game.render() draws the whole state; the protocol has no per-seat text view yet.
        print_fn("Note: this game hides information, but the board below shows everything (no peeking!).")
    try:
        while not is_over(game):
            print_fn(game.render())
            movers = game.to_move()
            # Opponents choose before the person types, but from the same position (simultaneous moves).
            actions = {seat: _opponent_action(opponent, game, seat, rng) for seat in movers if seat != human_seat}
            if human_seat in movers:
                actions[human_seat] = _ask_action(game, human_seat, input_fn, print_fn)
            for seat in sorted(s for s in actions if s != human_seat):
                print_fn(f"seat {seat} plays {actions[seat]}")
            game.step(actions)
    except EOFError:
        print_fn("\nBye.")
        return PlayResult(False, tuple(float(r) for r in game.returns()), tuple(game.history()), human_seat)
    returns = np.asarray(game.returns(), dtype=np.float64)
    print_fn(game.render())
    print_fn(_verdict(returns, human_seat) + f" Returns per seat: {' '.join(f'{r:g}' for r in returns)}")
    return PlayResult(True, tuple(float(r) for r in returns), tuple(game.history()), human_seat)
