"""Native connect four and tic-tac-toe: cross-checked move by move against pyspiel, the batched
engine against the single-game path (LoopVectorGame), literal positions, and the PettingZoo export."""

from __future__ import annotations

import warnings

import numpy as np
import pyspiel
import pytest
from pettingzoo.test import api_test, seed_test

from ludus.games import registry
from ludus.games.adapters.aec import to_aec_env
from ludus.games.core import GameError, LoopVectorGame, counter_seed_source
from ludus.games.builtin.native import (CONNECT_FOUR, TIC_TAC_TOE, MNKGame, MNKRules, MNKVectorGame,
                          fast_counter_seed_source)

RULES = [CONNECT_FOUR, TIC_TAC_TOE]


def spiel_mask(state: pyspiel.State, num_actions: int) -> np.ndarray:
    mask = np.zeros(num_actions, dtype=bool)
    mask[state.legal_actions()] = True
    return mask


def spiel_planes(state: pyspiel.State, seat: int, rules: MNKRules) -> np.ndarray:
    """pyspiel's observation tensor rearranged to (own, opponent, empty) of `seat`.

    connect_four's tensor is (x, o, empty) with the bottom row first; tic_tac_toe's is
    (empty, o, x) with the top row first; neither is from the seat's point of view."""
    tensor = np.asarray(state.observation_tensor(seat), dtype=np.float32).reshape(3, rules.rows, rules.cols)
    x, o, empty = (tensor[0], tensor[1], tensor[2]) if rules.gravity else (tensor[2], tensor[1], tensor[0])
    return np.stack([x, o, empty] if seat == 0 else [o, x, empty])


def spiel_text(state: pyspiel.State) -> str:
    return str(state).rstrip("\n")


# -- the single game against pyspiel ----------------------------------------------------------


@pytest.mark.parametrize("rules", RULES, ids=lambda r: r.name)
def test_single_game_matches_pyspiel_on_random_games(rules):
    spiel_game = pyspiel.load_game(rules.spiel_name)
    game = MNKGame(rules)
    rng = np.random.default_rng(1)
    outcomes = set()
    for episode in range(1500):
        state = spiel_game.new_initial_state()
        game.reset(episode)
        while not state.is_terminal():
            seat = state.current_player()
            assert game.to_move() == (seat,)
            assert not game.is_terminal()
            assert np.array_equal(game.legal_mask(seat), spiel_mask(state, rules.num_actions))
            assert not game.legal_mask(1 - seat).any()
            if episode % 10 == 0:
                for s in (0, 1):
                    assert np.array_equal(game.observation(s), spiel_planes(state, s, rules))
            action = int(rng.choice(state.legal_actions()))
            rewards = game.step({seat: action})
            state.apply_action(action)
            assert np.array_equal(rewards, state.rewards())
        assert game.is_terminal() and not game.is_truncated() and game.to_move() == ()
        assert np.array_equal(game.returns(), state.returns())
        assert game.history() == tuple(state.history())
        assert game.render() == spiel_text(state)
        outcomes.add(tuple(state.returns()))
    assert outcomes >= {(1.0, -1.0), (-1.0, 1.0)}  # both seats won some games


# -- the batched engine against pyspiel and against the single-game path -----------------------


@pytest.mark.parametrize("rules", RULES, ids=lambda r: r.name)
def test_vector_game_matches_pyspiel_on_random_games(rules):
    num_games = 96
    spiel_game = pyspiel.load_game(rules.spiel_name)
    vec = MNKVectorGame(rules, num_games, seed=0)
    states = [spiel_game.new_initial_state() for _ in range(num_games)]
    rng = np.random.default_rng(2)
    ts = vec.reset(np.arange(num_games))
    finished, step = 0, 0
    while finished < 2000:
        actions = np.full((num_games, 2), -1)
        for b, state in enumerate(states):
            seat = state.current_player()
            assert ts.acting[b].tolist() == [seat == 0, seat == 1]
            assert np.array_equal(ts.mask[b, seat], spiel_mask(state, rules.num_actions))
            assert not ts.mask[b, 1 - seat].any() and not ts.obs[b, 1 - seat].any()
            if step % 4 == 0:
                assert np.array_equal(ts.obs[b, seat], spiel_planes(state, seat, rules))
                assert vec.history(b) == tuple(state.history())
            actions[b, seat] = rng.choice(state.legal_actions())
        ts = vec.step(actions)
        step += 1
        for b, state in enumerate(states):
            state.apply_action(int(actions[b, state.current_player()]))
            assert ts.done[b] == state.is_terminal()
            if state.is_terminal():
                assert np.array_equal(ts.rewards[b], state.rewards())
                assert np.array_equal(ts.final_returns[b], state.returns())
                assert ts.final_lengths[b] == len(state.history())
                states[b] = spiel_game.new_initial_state()
                finished += 1
            else:
                assert not ts.rewards[b].any() and not ts.final_returns[b].any() and ts.final_lengths[b] == 0
        assert not ts.truncated.any()
    for b, state in enumerate(states):
        assert vec.render(b) == spiel_text(state)


@pytest.mark.parametrize("rules", RULES, ids=lambda r: r.name)
def test_vector_game_equals_loop_over_single_games(rules):
    """Same actions into the bitboard engine and into LoopVectorGame(MNKGame): identical TimeSteps,
    across many auto-resets."""
    num_games = 64
    native = MNKVectorGame(rules, num_games, seed=5)
    loop = LoopVectorGame(lambda: MNKGame(rules), num_games, seed=5)
    rng = np.random.default_rng(3)
    ts_native, ts_loop = native.reset(np.arange(num_games)), loop.reset(np.arange(num_games))
    ended = 0
    for step in range(300):
        for field in ts_native.__dataclass_fields__:
            a, b = getattr(ts_native, field), getattr(ts_loop, field)
            if field == "final_records":  # text-move games only
                assert a is None and b is None, (field, step)
                continue
            assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), (field, step)
        if step % 25 == 0:
            moves, counts = native.history_array()
            for b in range(num_games):
                assert native.history(b) == loop.history(b) == tuple(moves[b, :counts[b]])
                assert native.render(b) == loop.render(b)
        # random legal action for the acting seat, garbage (ignored) for the other
        legal = ts_native.mask.any(axis=1)
        choice = np.argmax(rng.random(legal.shape) * legal, axis=1)
        actions = np.where(ts_native.acting, choice[:, None], 99)
        ts_native, ts_loop = native.step(actions), loop.step(actions)
        ended += int(ts_native.done.sum())
    assert ended > 3 * num_games


def test_timestep_arrays_are_fresh():
    vec = MNKVectorGame(CONNECT_FOUR, 8, seed=0)
    first = vec.reset(np.zeros(8, dtype=np.int64))
    arrays = [name for name in first.__dataclass_fields__ if name != "final_records"]  # None: no text moves
    assert first.final_records is None
    kept = {name: getattr(first, name).copy() for name in arrays}
    second = vec.step(np.full((8, 2), 3))
    vec.step(np.full((8, 2), 3))
    for name, value in kept.items():
        assert np.array_equal(getattr(first, name), value), name
        assert not np.shares_memory(getattr(first, name), getattr(second, name)), name


# -- literal positions ------------------------------------------------------------------------

CONNECT_FOUR_CASES = {
    "vertical": ([0, 1, 0, 1, 0, 1, 0], (1.0, -1.0)),
    "horizontal": ([0, 0, 1, 1, 2, 2, 3], (1.0, -1.0)),
    "horizontal_filled_in_the_middle": ([0, 0, 1, 1, 3, 3, 2], (1.0, -1.0)),
    "diagonal_up_right": ([0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3], (1.0, -1.0)),
    "diagonal_up_left": ([6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3], (1.0, -1.0)),
    "second_player_vertical": ([0, 1, 0, 1, 0, 1, 2, 1], (-1.0, 1.0)),
    "full_board_draw": ([6, 1, 3, 5, 3, 0, 3, 3, 4, 4, 2, 4, 1, 2, 4, 6, 4, 1, 6, 1, 6,
                         1, 4, 5, 1, 3, 0, 0, 0, 3, 0, 2, 2, 6, 6, 0, 5, 5, 2, 5, 2, 5], (0.0, 0.0)),
}
TIC_TAC_TOE_CASES = {
    "row": ([0, 3, 1, 4, 2], (1.0, -1.0)),
    "column_second_player": ([0, 1, 3, 4, 8, 7], (-1.0, 1.0)),
    "diagonal": ([0, 1, 4, 2, 8], (1.0, -1.0)),
    "anti_diagonal": ([2, 0, 4, 1, 6], (1.0, -1.0)),
    "full_board_draw": ([0, 1, 2, 4, 3, 5, 7, 6, 8], (0.0, 0.0)),
}
LITERALS = ([(CONNECT_FOUR, name, *case) for name, case in CONNECT_FOUR_CASES.items()]
            + [(TIC_TAC_TOE, name, *case) for name, case in TIC_TAC_TOE_CASES.items()])


@pytest.mark.parametrize("rules,name,moves,expected", LITERALS, ids=[f"{r.name}-{n}" for r, n, *_ in LITERALS])
def test_literal_positions(rules, name, moves, expected):
    state = pyspiel.load_game(rules.spiel_name).new_initial_state()
    game = MNKGame(rules)
    vec = MNKVectorGame(rules, 3, seed=0)  # the sequence runs in slot 1; slots 0 and 2 copy it
    vec.reset(np.zeros(3, dtype=np.int64))
    for i, action in enumerate(moves):
        assert not state.is_terminal() and not game.is_terminal(), f"{name}: ended before move {i}"
        seat = i % 2
        state.apply_action(action)
        game.step({seat: action})
        ts = vec.step(np.full((3, 2), action))
        assert ts.done.tolist() == [i == len(moves) - 1] * 3
    assert state.is_terminal() and game.is_terminal()
    assert tuple(state.returns()) == expected
    assert tuple(game.returns()) == expected
    assert tuple(ts.final_returns[1]) == expected and ts.final_lengths[1] == len(moves)
    assert vec.history(1) == () and ts.acting[1].tolist() == [True, False]  # already reset


def test_literal_board_text_and_planes():
    game = MNKGame(CONNECT_FOUR)
    for seat, action in enumerate([3, 3, 4]):
        game.step({seat % 2: action})
    assert game.render() == "\n".join([".......", ".......", ".......", ".......", "...o...", "...xx.."])
    own, opponent, empty = game.observation(1)  # seat 1 ('o') is to move
    assert own[1, 3] == 1 and own.sum() == 1  # row 0 is the bottom row
    assert opponent[0, 3] == opponent[0, 4] == 1 and opponent.sum() == 2
    assert empty.sum() == 39
    vec = MNKVectorGame(CONNECT_FOUR, 1, seed=0)
    vec.reset([0])
    for action in [3, 3]:
        vec.step(np.full((1, 2), action))
    ts = vec.step(np.full((1, 2), 4))
    assert np.array_equal(ts.obs[0, 1], game.observation(1)) and not ts.obs[0, 0].any()
    assert vec.render(0) == game.render()


# -- errors, seeds, registry ------------------------------------------------------------------


def test_illegal_moves_raise():
    game = MNKGame(CONNECT_FOUR)
    for _ in range(3):
        game.step({0: 0})
        game.step({1: 0})
    with pytest.raises(GameError, match="illegal action 0"):
        game.step({0: 0})  # full column
    with pytest.raises(GameError, match="seat 0 is to move"):
        game.step({1: 2})
    with pytest.raises(GameError, match="illegal action 7"):
        game.step({0: 7})
    vec = MNKVectorGame(CONNECT_FOUR, 2, seed=0)
    vec.reset([0, 0])
    for _ in range(6):
        vec.step(np.array([[0, 0], [1, 1]]))
    with pytest.raises(GameError, match="illegal action 0 in slot 0"):
        vec.step(np.array([[0, 0], [1, 1]]))
    with pytest.raises(GameError, match="out of range"):
        vec.step(np.array([[2, 2], [-1, -1]]))
    with pytest.raises(GameError, match="shape"):
        vec.step(np.zeros((3, 2), dtype=np.int64))
    with pytest.raises(GameError, match="integer"):
        vec.step(np.zeros((2, 2)))
    with pytest.raises(GameError, match="seeds"):
        vec.reset([0])
    ttt = MNKVectorGame(TIC_TAC_TOE, 1, seed=0)
    ttt.reset([0])
    ttt.step(np.array([[4, 4]]))
    with pytest.raises(GameError, match="illegal action 4"):
        ttt.step(np.array([[4, 4]]))
    done = MNKGame(TIC_TAC_TOE)
    for i, action in enumerate([0, 3, 1, 4, 2]):
        done.step({i % 2: action})
    with pytest.raises(GameError, match="over"):
        done.step({1: 5})


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3, 2**130 + 11])
def test_fast_seed_source_equals_counter_seed_source(seed):
    slow, fast = counter_seed_source(seed), fast_counter_seed_source(seed)
    for n in (1, 0, 5, 300, 2):
        assert np.array_equal(slow(n), fast(n))


def test_one_seed_is_drawn_per_new_game():
    vec = MNKVectorGame(TIC_TAC_TOE, 4, seed=0)
    drawn = []
    vec.seed_source = lambda n: drawn.append(n) or np.arange(n, dtype=np.uint64)
    ts = vec.reset(np.arange(4))
    ends = 0
    for _ in range(40):
        legal = ts.mask.any(axis=1)
        ts = vec.step(np.repeat(np.argmax(legal, axis=1)[:, None], 2, axis=1))
        ends += int(ts.done.sum())
    assert sum(drawn) == ends > 0


def test_registry_builds_native_games():
    c4 = registry.make("connect_four")
    assert isinstance(c4, MNKGame)
    spec = c4.spec
    assert (spec.id, spec.spiel_name, spec.num_players, spec.num_actions, spec.observation_shape) == (
        "connect_four", "connect_four", 2, 7, (3, 6, 7))
    assert spec.zero_sum and spec.utility_sum == 0.0 and (spec.min_utility, spec.max_utility) == (-1.0, 1.0)
    assert spec.max_length == 42 and not spec.has_chance and spec.perfect_information
    ttt = registry.make("tic_tac_toe").spec
    assert (ttt.num_actions, ttt.observation_shape, ttt.max_length, ttt.spiel_name) == (9, (3, 3, 3), 9, "tic_tac_toe")
    vec = registry.make_vector("tic_tac_toe", 16, seed=3)
    assert isinstance(vec, MNKVectorGame) and vec.num_games == 16
    assert {"connect_four", "tic_tac_toe"} <= set(registry.native_names())
    with pytest.raises(GameError, match="bad parameters"):
        registry.make("connect_four(rows=5)")


# -- PettingZoo export ------------------------------------------------------------------------


@pytest.mark.parametrize("game_id", ["connect_four", "tic_tac_toe"])
def test_aec_export_passes_pettingzoo_tests(game_id):
    with warnings.catch_warnings():
        # api_test warns that Dict observations are not arrays; it exempts PettingZoo's own
        # board games (which use the same Dict) by name only.
        warnings.filterwarnings("ignore", message="Observation is not a NumPy array")
        warnings.filterwarnings("ignore", message="Observation space for each agent probably")
        api_test(to_aec_env(game_id), num_cycles=300)
        seed_test(lambda: to_aec_env(game_id), num_cycles=300)


def test_aec_export_plays_a_literal_game():
    env = to_aec_env("tic_tac_toe", render_mode="ansi")
    env.reset(seed=0)
    for action in [0, 3, 1, 4, 2]:
        obs, *_ = env.last()
        assert obs["action_mask"].dtype == np.int8 and obs["action_mask"][action] == 1
        env.step(action)
    assert env.render() == "xxx\noo.\n..."
    seen = {}
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, _ = env.last()
        assert terminated and not truncated
        seen[agent] = reward
        env.step(None)
    assert seen == {"player_0": 1.0, "player_1": -1.0}
