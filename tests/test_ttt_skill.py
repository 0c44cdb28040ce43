"""Perfect-play enumeration (evaluation/perfect_play.py) and, slow, the tic_tac_toe preset's skill."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ludus.agents.bots.builtin import PerfectTicTacToe, ScriptedBot
from ludus.agents.policy import RandomPolicy
from ludus.evaluation.perfect_play import (
    PerfectPlayError,
    format_perfect_play,
    losses_against_perfect,
)
from ludus.games.registry import make, spec

TTT = spec("tic_tac_toe")


def lowest_cell_agent() -> ScriptedBot:
    """Always the lowest-numbered empty cell: deterministic, and easy to follow by hand."""
    return ScriptedBot(lambda obs, mask, seat, history, rng: int(np.argmax(mask)), name="lowest-cell")


def replay_returns(moves: tuple[int, ...]) -> np.ndarray:
    game = make("tic_tac_toe")
    game.reset(0)
    for ply, cell in enumerate(moves):
        game.step({ply % 2: cell})
    assert game.is_terminal()
    return game.returns()


def test_perfect_player_never_loses_to_itself():
    report = losses_against_perfect(PerfectTicTacToe(), TTT)
    assert report.losses == 0 and report.wins == 0
    assert all(s.lines == s.draws > 0 for s in report.seats)


def test_perfect_player_reading_observations_never_loses():
    # The same solver reading the board from the observations it is given (not the history):
    # zero losses means the agent sees its own seat's planes (own, opponent, empty) of the position.
    agent = PerfectTicTacToe(obs_layout="seat_relative")
    agent.needs_history = False
    report = losses_against_perfect(agent, TTT)
    assert report.losses == 0 and report.lines == report.draws


def test_lowest_cell_agent_first_loses_the_one_line_worked_out_by_hand():
    # x=0; the only optimal reply to a corner is the centre (o=4); x=1 threatens 0-1-2, the only
    # reply that does not lose is the block o=2; x=3 threatens 0-3-6 but o, with 2 and 4, wins at
    # 6 (and only 6 is optimal: anything else lets x complete 0-3-6). One line, lost.
    report = losses_against_perfect(lowest_cell_agent(), TTT)
    first = report.seats[0]
    assert (first.lines, first.wins, first.draws, first.losses) == (1, 0, 0, 1)
    assert first.losing_lines == ((0, 4, 1, 2, 3, 6),)
    assert first.agent_decisions == 3


def _optimal_replies_by_pyspiel():
    """(optimal moves of a position, the game): an independent negamax over pyspiel's tic_tac_toe."""
    import pyspiel

    game = pyspiel.load_game("tic_tac_toe")

    @functools.cache
    def value(history: tuple[int, ...]) -> float:
        state = game.new_initial_state()
        for a in history:
            state.apply_action(a)
        if state.is_terminal():
            return state.returns()[len(history) % 2]  # for the player who would move next
        return max(-value(history + (a,)) for a in state.legal_actions())

    def replies(history: tuple[int, ...]) -> list[int]:
        state = game.new_initial_state()
        for a in history:
            state.apply_action(a)
        values = {a: -value(history + (a,)) for a in state.legal_actions()}
        best = max(values.values())
        return [a for a, v in values.items() if v == best]

    return replies, game


def test_lowest_cell_agent_second_matches_an_independent_enumeration():
    replies, game = _optimal_replies_by_pyspiel()
    lines = losses = 0

    def walk(history: tuple[int, ...]) -> None:
        nonlocal lines, losses
        state = game.new_initial_state()
        for a in history:
            state.apply_action(a)
        if state.is_terminal():
            lines += 1
            losses += state.returns()[1] < 0
            return
        if len(history) % 2 == 1:  # the agent (seat 1) moves: lowest empty cell
            walk(history + (min(state.legal_actions()),))
        else:
            for a in replies(history):
                walk(history + (a,))

    walk(())
    second = losses_against_perfect(lowest_cell_agent(), TTT).seats[1]
    assert (second.lines, second.losses) == (lines, losses)
    assert second.lines >= 9  # every opening of the perfect player is optimal (tic-tac-toe is a draw)


def test_random_policy_loses_some_lines_in_both_seats():
    report = losses_against_perfect(RandomPolicy(), TTT, seed=3)
    assert report.seats[0].losses > 0 and report.seats[1].losses > 0
    assert report.wins == 0  # nobody beats the perfect player
    for s in report.seats:
        assert s.lines == s.wins + s.draws + s.losses
        for moves in s.losing_lines:
            assert replay_returns(moves)[s.agent_seat] == -1.0
    assert "lost with seat" in format_perfect_play(report)


def test_greedy_net_gives_the_same_report_whatever_the_seed():
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.torch_policy import TorchPolicy

    torch.manual_seed(0)
    policy = TorchPolicy(ActorCritic(TTT, NetConfig(hidden=(16,))))
    assert losses_against_perfect(policy, TTT, seed=1) == losses_against_perfect(policy, TTT, seed=2)


def test_other_games_are_refused():
    with pytest.raises(PerfectPlayError, match="tic_tac_toe"):
        losses_against_perfect(RandomPolicy(), spec("connect_four"))


@pytest.mark.slow
def test_tic_tac_toe_preset_learns_perfect_play():
    """`ludus train tic_tac_toe` (seed 0): the learner's final weights, greedy, lose no line of play
    against the perfect player (benchmarks/ttt_skill.py measures the same with timings)."""
    import tempfile

    from ludus.agents.torch_policy import TorchPolicy
    from ludus.league.api import League, load_config

    config = load_config("tic_tac_toe", ["seed=0", "log.wandb=disabled", "log.tensorboard=false",
                                         "log.progress=false"])
    with tempfile.TemporaryDirectory() as tmp:
        league = League.create(config, f"{tmp}/run")
        try:
            league.run()
            report = losses_against_perfect(TorchPolicy(league.learners["main"].impl.module), TTT)
        finally:
            league.close()
    print(format_perfect_play(report))
    assert report.losses == 0, format_perfect_play(report)
