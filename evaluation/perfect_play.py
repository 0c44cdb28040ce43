"""A tic-tac-toe agent against the perfect player in every line of play.

The perfect player (agents/bots/builtin.py `PerfectTicTacToe`) picks uniformly among ALL optimal moves
of the solved game, so sampling games against it can miss a rare line in which the agent
blunders. Here nothing is sampled: the game tree is walked from the empty board with the agent
in one seat and the perfect player in the other. At the agent's turns the agent answers (one
move per position; greedy by default, so the walk is exactly the set of games the deterministic
agent can play); at the perfect player's turns the walk branches on every optimal move
(`tic_tac_toe_solution().best_moves`). Every leaf is one line of play: a finished game the
perfect player can reach with positive probability against this agent. An agent that plays
perfectly loses none of them.

The agent sees what the league's runners give it: observations and legal masks of the native
``tic_tac_toe`` game from its own seat (planes own, opponent, empty), and the move history when
its `needs_history` is set. Positions at the same depth are answered in one batched `act`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ludus.agents.bots.builtin import board_from_history, tic_tac_toe_solution
from ludus.agents.policy import ActBatch, Policy
from ludus.games.core import GameSpec
from ludus.errors import UserError

GAME_ID = "tic_tac_toe"


class PerfectPlayError(UserError):
    """Perfect-play enumeration asked of a game it does not cover."""


@dataclass(frozen=True)
class SeatLines:
    """The lines of play with the agent in one seat."""

    agent_seat: int
    """0: the agent plays crosses and moves first; 1: noughts, second."""
    lines: int
    """Finished games the perfect player can reach against the agent (leaves of the walk)."""
    wins: int
    draws: int
    losses: int
    """Of those lines, how many the agent wins, draws and loses."""
    agent_decisions: int
    """Positions at which the agent was asked to move."""
    losing_lines: tuple[tuple[int, ...], ...]
    """The move sequences (cell ids, crosses first) of the lost lines."""


@dataclass(frozen=True)
class PerfectPlayReport:
    """`losses_against_perfect`'s result: one `SeatLines` per seat of the agent (seat 0 first)."""

    seats: tuple[SeatLines, ...]
    greedy: bool
    """Whether the agent acted greedily (argmax); otherwise one sampled move per position."""

    @property
    def lines(self) -> int:
        return sum(s.lines for s in self.seats)

    @property
    def wins(self) -> int:
        return sum(s.wins for s in self.seats)

    @property
    def draws(self) -> int:
        return sum(s.draws for s in self.seats)

    @property
    def losses(self) -> int:
        return sum(s.losses for s in self.seats)


def _replay(history: tuple[int, ...], game) -> None:
    """Put the native `game` in the position after `history` (crosses, seat 0, move first)."""
    game.reset(0)
    for ply, cell in enumerate(history):
        game.step({ply % 2: cell})


def _position(history: tuple[int, ...], seat: int, game) -> tuple[np.ndarray, np.ndarray]:
    """Observation and legal mask of `seat` after `history`."""
    _replay(history, game)
    return game.observation(seat), game.legal_mask(seat)


def _outcome(history: tuple[int, ...], game) -> np.ndarray | None:
    """Final returns per seat if `history` ends the game, else None."""
    _replay(history, game)
    return game.returns() if game.is_terminal() else None


def _walk(policy: Policy, agent_seat: int, greedy: bool, rng: np.random.Generator) -> SeatLines:
    from ludus.games.registry import make

    game = make(GAME_ID)
    solution = tic_tac_toe_solution()
    frontier: list[tuple[int, ...]] = [()]
    wins = draws = losses = decisions = 0
    losing: list[tuple[int, ...]] = []
    while frontier:
        # Every live position of the frontier has the same depth, hence the same player to move.
        depth = len(frontier[0])
        if depth % 2 == agent_seat:
            positions = [_position(h, agent_seat, game) for h in frontier]
            batch = ActBatch(obs=np.stack([p[0] for p in positions]), mask=np.stack([p[1] for p in positions]),
                             seats=np.full(len(frontier), agent_seat, dtype=np.int64),
                             histories=list(frontier) if policy.needs_history else None)
            actions = policy.act(batch, rng, greedy=greedy).actions
            if not batch.mask[np.arange(len(frontier)), actions].all():
                raise ValueError("the agent chose an illegal move")
            decisions += len(frontier)
            children = [h + (int(a),) for h, a in zip(frontier, actions.tolist())]
        else:
            children = [h + (cell,) for h in frontier for cell in solution[board_from_history(h)].best_moves]
        frontier = []
        for child in children:
            returns = _outcome(child, game)
            if returns is None:
                frontier.append(child)
                continue
            mine = float(returns[agent_seat])
            wins += mine > 0
            draws += mine == 0
            if mine < 0:
                losses += 1
                losing.append(child)
    return SeatLines(agent_seat, wins + draws + losses, wins, draws, losses, decisions, tuple(losing))


def losses_against_perfect(policy: Policy, spec: GameSpec, greedy: bool = True, seed: int = 0) -> PerfectPlayReport:
    """The agent against the perfect tic-tac-toe player in every line of play, in both seats.

    Args:
        policy: the agent (any `Policy`; a net's `TorchPolicy` is deterministic when greedy).
        spec: the game's spec; must be the native ``tic_tac_toe`` (its observations are what the
            agent was trained on).
        greedy: the agent plays its argmax. With sampling, each position gets one sampled move, so
            the lines are a sample of the agent's games, not all of them.
        seed: seeds the Generator passed to the agent's `act` (used only by sampling agents).
    """
    if spec.id != GAME_ID:
        raise PerfectPlayError(f"perfect-play enumeration covers the native {GAME_ID!r} game only, "
                               f"not {spec.id!r}")
    rng = np.random.default_rng(seed)
    return PerfectPlayReport(tuple(_walk(policy, seat, greedy, rng) for seat in (0, 1)), greedy)


def format_perfect_play(report: PerfectPlayReport) -> str:
    """A small table: lines, wins, draws, losses per seat, and the first losing lines."""
    mode = "greedy" if report.greedy else "sampling"
    lines = [f"against the perfect player, every optimal reply enumerated ({mode} agent):",
             f"{'agent seat':<16} {'lines':>6} {'W':>5} {'D':>5} {'L':>5} {'decisions':>10}"]
    for s in report.seats:
        name = "0 (x, first)" if s.agent_seat == 0 else "1 (o, second)"
        lines.append(f"{name:<16} {s.lines:>6} {s.wins:>5} {s.draws:>5} {s.losses:>5} {s.agent_decisions:>10}")
    lines.append(f"{'total':<16} {report.lines:>6} {report.wins:>5} {report.draws:>5} {report.losses:>5}")
    for s in report.seats:
        for line in s.losing_lines[:5]:
            lines.append(f"  lost with seat {s.agent_seat}: moves {list(line)}")
    return "\n".join(lines)
