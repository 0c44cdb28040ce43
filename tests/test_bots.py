"""Reference bots: MCTS, the perfect tic-tac-toe player, scripted bots and `make_bot` names."""

from __future__ import annotations

import numpy as np
import pytest

from ludus.agents.bots.builtin import (BotError, MCTSBot, PerfectTicTacToe, RandomBot, ScriptedBot, board_from_history,
                         board_from_observation, make_bot, tic_tac_toe_solution)
from ludus.agents.policy import ActBatch, Policy
from ludus.games import registry
from ludus.games.core import Game, is_over


def play_game(game: Game, policies: list[Policy], seed: int, rng: np.random.Generator) -> tuple[np.ndarray, tuple]:
    """One game, each seat asking its policy one row at a time; returns (returns, history)."""
    game.reset(seed)
    while not is_over(game):
        actions = {}
        for seat in game.to_move():
            policy = policies[seat]
            batch = ActBatch(game.observation(seat)[None], game.legal_mask(seat)[None], np.array([seat]),
                             [game.history()] if policy.needs_history else None)
            actions[seat] = int(policy.act(batch, rng).actions[0])
        game.step(actions)
    return game.returns(), game.history()


def results_of(bot: Policy, opponent: Policy, game_id: str, games: int, seed: int) -> list[float]:
    """`bot`'s return in each game, alternating seats."""
    game, rng, out = registry.make(game_id), np.random.default_rng(seed), []
    for i in range(games):
        seat = i % 2
        policies = [bot, opponent] if seat == 0 else [opponent, bot]
        returns, _ = play_game(game, policies, seed + i, rng)
        out.append(float(returns[seat]))
    return out


# ----------------------------------------------------------------------------------------- MCTS

@pytest.mark.parametrize("game_id", ["tic_tac_toe", "spiel:tic_tac_toe"])
def test_mcts_beats_random_at_tic_tac_toe(game_id):
    mcts = make_bot("mcts-50", registry.make(game_id).spec)
    results = results_of(mcts, RandomBot(), game_id, games=8, seed=1)
    assert results.count(1.0) >= 6 and results.count(-1.0) == 0, results


def test_mcts_uses_a_fresh_seed_each_game():
    # Two weak MCTS bots (4 simulations) from one Generator: with a seed reused per game every game
    # would be the same sequence of moves.
    game = registry.make("tic_tac_toe")
    bot = MCTSBot("tic_tac_toe", simulations=4, solve=False)
    rng = np.random.default_rng(0)
    histories = {play_game(game, [bot, bot], i, rng)[1] for i in range(6)}
    assert len(histories) >= 4


def test_mcts_replays_exactly_from_the_generator_seed():
    game = registry.make("tic_tac_toe")
    bot = MCTSBot("tic_tac_toe", simulations=4, solve=False)
    first = [play_game(game, [bot, bot], 0, np.random.default_rng(7))[1] for _ in range(3)]
    assert first[0] == first[1] == first[2]
    other_bot = MCTSBot("tic_tac_toe", simulations=4, solve=False, seed=1)
    others = {play_game(game, [other_bot, other_bot], 0, np.random.default_rng(s))[1] for s in range(6)}
    assert len(others | {first[0]}) >= 3


@pytest.mark.parametrize("compiled", [True, False])
def test_mcts_plays_native_connect_four_through_its_history(compiled):
    game = registry.make("connect_four")
    game.reset(0)
    for action in (3, 0, 3, 0, 3):  # three crosses up column 3: seat 1 must block on top
        game.step({game.to_move()[0]: action})
    bot = make_bot(f"mcts(simulations=300,uct_c=1.4,rollouts=2,seed=3,compiled={str(compiled).lower()})",
                   game.spec)
    assert isinstance(bot, MCTSBot) and bot.simulations == 300 and bot.rollouts == 2 and bot.uct_c == 1.4
    assert (bot._compiled_search is not None) == compiled
    batch = ActBatch(game.observation(1)[None], game.legal_mask(1)[None], np.array([1]), [game.history()])
    assert bot.act(batch, np.random.default_rng(0)).actions[0] == 3


def _connect_four_positions(count: int, seed: int) -> list[tuple[int, ...]]:
    """Histories of live positions at depths 0, 3, 6, ... reached by random play."""
    import pyspiel

    game, rng, out = pyspiel.load_game("connect_four"), np.random.default_rng(seed), []
    while len(out) < count:
        state, history = game.new_initial_state(), []
        for _ in range(3 * len(out)):
            action = int(rng.choice(state.legal_actions()))
            state.apply_action(action)
            history.append(action)
            if state.is_terminal():
                break
        if not state.is_terminal():
            out.append(tuple(history))
    return out


def test_compiled_connect_four_search_plays_openspiels_move_distribution():
    # The compiled search is OpenSpiel's algorithm with other random numbers: at each position the
    # frequencies of its moves over many seeds must match OpenSpiel's own. Two OpenSpiel samples of
    # 400 seeds differ by a total variation of 0.02-0.09 at such positions; a search that shuffles
    # no children, drops the exploration term, stops backing up proven values or credits the wrong
    # mover fails here.
    spec = registry.make("connect_four").spec
    compiled, reference = MCTSBot("connect_four"), MCTSBot("connect_four", compiled=False)
    samples, rng = 400, np.random.default_rng(0)
    for history in _connect_four_positions(6, seed=4):
        seat = len(history) % 2
        batch = ActBatch(np.zeros((samples, 1)), np.ones((samples, spec.num_actions), bool),
                         np.full(samples, seat), [history] * samples)
        ours = np.bincount(compiled.act(batch, rng).actions, minlength=spec.num_actions) / samples
        theirs = np.bincount(reference.act(batch, rng).actions, minlength=spec.num_actions) / samples
        assert 0.5 * np.abs(ours - theirs).sum() < 0.15, (history, ours.round(2), theirs.round(2))


def test_compiled_connect_four_search_is_as_strong_as_openspiels():
    # Head to head, seats alternating: 200 games score 0.5 +- 0.035 (one standard deviation) when
    # the two are the same player (measured 0.495; OpenSpiel against itself 0.498); the compiled
    # MCTS-25 scores 0.16 against OpenSpiel's MCTS-100.
    spec = registry.make("connect_four").spec
    scores = [(1 + r) / 2 for r in results_of(make_bot("mcts-100", spec), make_bot("mcts-100(compiled=false)", spec),
                                              "connect_four", games=200, seed=5)]
    assert 0.40 <= float(np.mean(scores)) <= 0.60, np.mean(scores)


def test_compiled_connect_four_search_replays_from_its_seed_and_refuses_bad_histories():
    game = registry.make("connect_four")
    bot = MCTSBot("connect_four", simulations=8, solve=False)
    first = [play_game(game, [bot, bot], 0, np.random.default_rng(7))[1] for _ in range(2)]
    assert first[0] == first[1]
    assert len({play_game(game, [bot, bot], 0, np.random.default_rng(s))[1] for s in range(4)}) >= 3
    mask = np.ones((1, 7), bool)
    for history, seat in [((0, 1, 0, 1, 0, 1, 0), 1),      # seat 0 already won
                          ((0,) * 7, 1),                   # a seventh stone in a six-row column
                          ((0, 1), 1)]:                    # seat 0 is to move, not seat 1
        with pytest.raises(ValueError, match="does not give a position"):
            bot.act(ActBatch(np.zeros((1, 1)), mask, np.array([seat]), [history]), np.random.default_rng(0))


def test_compiled_connect_four_search_with_one_simulation_samples_legal_moves_uniformly():
    # OpenSpiel's MCTSBot samples from the evaluator's (uniform) prior when it may simulate once.
    history = (0,) * 6                                     # column 0 is full
    batch = ActBatch(np.zeros((1200, 1)), np.ones((1200, 7), bool), np.zeros(1200, np.int64), [history] * 1200)
    counts = np.bincount(MCTSBot("connect_four", simulations=1).act(batch, np.random.default_rng(0)).actions,
                         minlength=7)
    assert counts[0] == 0 and (np.abs(counts[1:] - 200) < 50).all(), counts


def test_mcts_refuses_what_it_cannot_search():
    with pytest.raises(BotError, match="deterministic turn-based perfect-information"):
        make_bot("mcts", registry.make("spiel:kuhn_poker").spec)
    with pytest.raises(BotError, match="needs ActBatch.histories"):
        MCTSBot("tic_tac_toe").act(ActBatch(np.zeros((1, 27)), np.ones((1, 9), bool), np.array([0])),
                                   np.random.default_rng(0))


# ---------------------------------------------------------------------------------- perfect player

def test_solver_counts_every_position_and_the_empty_board_is_a_draw_everywhere():
    solution = tic_tac_toe_solution()
    assert len(solution) == 5478
    empty = solution[(0,) * 9]
    assert empty.value == 0 and empty.best_moves == tuple(range(9))
    # After x in a corner, the only move that does not lose for o is the centre.
    assert solution[board_from_history((0,))].best_moves == (4,)


def test_perfect_player_samples_all_nine_opening_moves():
    batch = ActBatch(np.zeros((900, 27), np.float32), np.ones((900, 9), bool), np.zeros(900, np.int64),
                     [()] * 900)
    counts = np.bincount(PerfectTicTacToe().act(batch, np.random.default_rng(0)).actions, minlength=9)
    assert (counts > 60).all(), counts


@pytest.mark.parametrize("game_id", ["tic_tac_toe", "spiel:tic_tac_toe"])
def test_perfect_player_never_loses_to_random(game_id):
    results = results_of(make_bot("perfect", registry.make(game_id).spec), RandomBot(), game_id, 40, seed=2)
    assert min(results) >= 0.0 and results.count(1.0) >= 25, results


def test_perfect_player_draws_against_itself_by_many_different_games():
    perfect, game, rng = PerfectTicTacToe(), registry.make("tic_tac_toe"), np.random.default_rng(3)
    histories = set()
    for i in range(20):
        returns, history = play_game(game, [perfect, perfect], i, rng)
        assert returns.tolist() == [0.0, 0.0]
        histories.add(history)
    assert len(histories) >= 10


@pytest.mark.parametrize("game_id,layout", [("tic_tac_toe", "seat_relative"), ("spiel:tic_tac_toe", "openspiel")])
def test_board_from_observation_matches_the_history(game_id, layout):
    game, rng = registry.make(game_id), np.random.default_rng(4)
    game.reset(0)
    while not is_over(game):
        seat = game.to_move()[0]
        assert board_from_observation(game.observation(seat), seat, layout) == board_from_history(game.history())
        game.step({seat: int(rng.choice(np.flatnonzero(game.legal_mask(seat))))})


def test_perfect_player_reads_the_observation_when_no_history_is_given():
    game = registry.make("tic_tac_toe")
    game.reset(0)
    for action in (0, 4, 8):
        game.step({game.to_move()[0]: action})
    batch = ActBatch(game.observation(1)[None], game.legal_mask(1)[None], np.array([1]))
    best = set(tic_tac_toe_solution()[board_from_history((0, 4, 8))].best_moves)
    picks = {int(PerfectTicTacToe("seat_relative").act(batch, np.random.default_rng(s)).actions[0]) for s in range(40)}
    assert picks == best == {1, 3, 5, 7}  # o must take an edge: a corner loses to a double threat
    with pytest.raises(BotError, match="needs ActBatch.histories"):
        PerfectTicTacToe().act(batch, np.random.default_rng(0))


# ------------------------------------------------------------------------------------- scripted

def test_scripted_bot_wraps_a_function_and_refuses_illegal_moves():
    seen = []

    def lowest_legal(obs, mask, seat, history, rng):
        seen.append((seat, history))
        return int(np.flatnonzero(mask)[0])

    bot = ScriptedBot(lowest_legal, needs_history=True)
    mask = np.array([[False, True, True], [True, False, False]])
    out = bot.act(ActBatch(np.zeros((2, 4)), mask, np.array([0, 1]), [(), (1,)]), np.random.default_rng(0))
    assert out.actions.tolist() == [1, 0] and seen == [(0, ()), (1, (1,))]
    assert out.log_probs.tolist() == [0.0, 0.0]
    with pytest.raises(BotError, match="illegal action 2"):
        ScriptedBot(lambda *a: 2).act(ActBatch(np.zeros((2, 4)), mask, np.array([0, 1])), np.random.default_rng(0))


# ----------------------------------------------------------------------------------------- names

def test_make_bot_names():
    spec = registry.make("tic_tac_toe").spec
    assert isinstance(make_bot("random", spec), RandomBot)
    assert isinstance(make_bot("perfect", spec), PerfectTicTacToe)
    assert make_bot("mcts-100", spec).simulations == 100
    assert make_bot("mcts(simulations=100)", spec).simulations == 100
    bot = make_bot("mcts(simulations=20, uct_c=1.5, solve=false)", spec)
    assert (bot.simulations, bot.uct_c, bot.solve) == (20, 1.5, False)


@pytest.mark.parametrize("name,game_id,message", [
    ("perfect", "connect_four", "tic-tac-toe only"),
    ("minimax", "tic_tac_toe", "unknown bot 'minimax'"),
    ("random(x=1)", "tic_tac_toe", "takes no parameters"),
    ("mcts(sims=3)", "tic_tac_toe", "unknown parameter"),
    ("mcts(simulations=abc)", "tic_tac_toe", "must be a number"),
    ("mcts-10(simulations=3)", "tic_tac_toe", "twice"),
    ("mcts-0", "tic_tac_toe", "simulations >= 1"),
    ("mcts", "gym:CartPole-v1", "OpenSpiel equivalent"),
    ("mcts[", "tic_tac_toe", "malformed bot name"),
])
def test_make_bot_refuses_bad_names_with_one_line(name, game_id, message):
    with pytest.raises(BotError, match=message) as info:
        make_bot(name, registry.make(game_id).spec)
    assert "\n" not in str(info.value)


def test_bots_are_spelled_bot_name_everywhere():
    from ludus.games.registry import spec as game_spec
    from ludus.league.config import load_config

    spec = game_spec("tic_tac_toe")
    assert type(make_bot("bot:perfect", spec)) is type(make_bot("perfect", spec))
    assert load_config("quickstart", ["anchors=[bot:random, perfect]"]).anchors == ("random", "perfect")
