"""The pyspiel, PettingZoo and Gymnasium adapters: known values and error messages."""

from __future__ import annotations

import numpy as np
import pyspiel
import pytest

from ludus.games import registry
from ludus.games.core import GameError, is_over
from ludus.games.adapters.gym import make_gym_game
from ludus.games.adapters.pz import make_pettingzoo_game
from ludus.games.adapters.spiel import load_spiel_game, make_spiel_game, observation_kind, spiel_observation, spiel_observation_kind


def play_random(game, seed: int, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Play one random legal game; returns (sum of step rewards, movers of each step)."""
    game.reset(seed)
    total = np.zeros(game.spec.num_players)
    movers_per_step = []
    while not is_over(game):
        movers = game.to_move()
        movers_per_step.append(movers)
        actions = {s: int(rng.choice(np.flatnonzero(game.legal_mask(s)))) for s in movers}
        total += game.step(actions)
    return total, movers_per_step


# --- OpenSpiel ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["tic_tac_toe", "connect_four", "kuhn_poker", "leduc_poker",
                                  "goofspiel(num_cards=4)", "kuhn_poker(players=3)"])
def test_spiel_rewards_sum_to_pyspiel_returns(text):
    game = make_spiel_game(text)
    rng = np.random.default_rng(0)
    for seed in range(60):
        total, _ = play_random(game, seed, rng)
        assert game.state.is_terminal()
        np.testing.assert_allclose(total, game.state.returns(), atol=1e-6)
        np.testing.assert_allclose(game.returns(), game.state.returns(), atol=1e-6)


def test_spiel_connect_four_final_returns_are_exactly_plus_minus_one():
    # shimmy pays the second finisher twice (-1/+2); we read state.returns().
    game = registry.make("spiel:connect_four")
    rng = np.random.default_rng(1)
    seen = set()
    for seed in range(80):
        play_random(game, seed, rng)
        seen.add(tuple(float(r) for r in game.returns()))
    assert seen <= {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}
    assert (1.0, -1.0) in seen and (-1.0, 1.0) in seen


def test_spiel_kuhn_poker_plays_past_the_first_decision_and_is_zero_sum():
    # shimmy counts the two card deals against max_game_length=3 and stops Kuhn after one move.
    game = registry.make("spiel:kuhn_poker")
    assert game.spec.max_length == 3 and game.spec.has_chance and not game.spec.perfect_information
    rng = np.random.default_rng(2)
    lengths = []
    for seed in range(200):
        _, movers = play_random(game, seed, rng)
        lengths.append(len(movers))
        assert game.returns().sum() == 0.0
        assert abs(game.returns()[0]) in (1.0, 2.0)
        # history holds the player decisions only, not the two chance deals
        assert len(game.history()) == len(movers)
    assert set(lengths) == {2, 3}


def test_spiel_chance_follows_the_reset_seed():
    game = make_spiel_game("kuhn_poker")
    deals = []
    for seed in range(30):
        game.reset(seed)
        deals.append(game.observation(0).tobytes())
        game.reset(seed)
        assert game.observation(0).tobytes() == deals[-1]
    assert len(set(deals)) == 3  # every card of player 0 shows up


def test_spiel_goofspiel_moves_simultaneously():
    game = registry.make("spiel:goofspiel(num_cards=4)")
    assert game.spec.simultaneous and game.spec.num_players == 2
    game.reset(0)
    assert game.to_move() == (0, 1)
    game.step({0: 3, 1: 0})
    assert game.history() == (3, 0)
    with pytest.raises(GameError, match="one action for each"):
        game.step({0: 1})


def test_spiel_spec_values():
    spec = registry.spec("spiel:kuhn_poker(players=3)")
    assert spec.id == "spiel:kuhn_poker(players=3)" and spec.spiel_name == "kuhn_poker(players=3)"
    # information-state tensors by default (perfect recall), observation tensors on request
    assert (spec.num_players, spec.num_actions, spec.observation_shape) == (3, 2, (17,))
    assert registry.spec("spiel:kuhn_poker(players=3)[observation]").observation_shape == (10,)
    assert registry.spec("spiel:kuhn_poker(players=3)[observation]").spiel_name == "kuhn_poker(players=3)"
    assert spec.zero_sum and spec.utility_sum == 0.0
    assert (spec.min_utility, spec.max_utility) == (-2.0, 4.0)
    assert registry.spec("spiel:connect_four").observation_shape == (3, 6, 7)
    assert registry.spec("spiel:leduc_poker").max_length == 8


@pytest.mark.parametrize("game_id, kind", [("leduc_poker", "information_state"),
                                            ("leduc_poker[observation]", "observation")])
def test_spiel_observation_matches_what_played(game_id, kind):
    game = make_spiel_game(game_id)
    assert game.kind == kind and spiel_observation_kind("spiel:" + game_id) == kind
    rng = np.random.default_rng(3)
    game.reset(5)
    while game.to_move():
        (seat,) = game.to_move()
        np.testing.assert_array_equal(spiel_observation(game.state, seat, kind), game.observation(seat))
        game.step({seat: int(rng.choice(np.flatnonzero(game.legal_mask(seat))))})


def _information_states(game: pyspiel.Game) -> dict[str, set[tuple[float, ...]]]:
    """Every information state of a small game with the set of tensors that seats get in it."""
    seen: dict[str, set[tuple[float, ...]]] = {}
    stack = [game.new_initial_state()]
    while stack:
        state = stack.pop()
        if state.is_terminal():
            continue
        if state.is_chance_node():
            stack.extend(state.child(a) for a, _ in state.chance_outcomes())
            continue
        seat = state.current_player()
        key = state.information_state_string(seat)
        seen.setdefault(key, set()).add(tuple(spiel_observation(state, seat, "information_state")))
        stack.extend(state.child(a) for a in state.legal_actions())
    return seen


def test_leduc_information_state_tensors_have_perfect_recall():
    # Leduc's observation tensor maps its 936 information states onto 516 tensors; the default
    # information-state tensor tells every one apart (and is one tensor per information state).
    seen = _information_states(load_spiel_game("leduc_poker"))
    assert len(seen) == 936
    assert all(len(tensors) == 1 for tensors in seen.values())
    assert len({t for tensors in seen.values() for t in tensors}) == 936
    assert registry.spec("spiel:leduc_poker").observation_shape == (30,)


def test_spiel_tensor_choice_is_checked():
    with pytest.raises(GameError, match="provides no information_state tensor"):
        registry.spec("spiel:connect_four[information_state]")
    with pytest.raises(GameError, match=r"suffix is \[observation\] or \[information_state\]"):
        registry.spec("spiel:leduc_poker[obs]")
    assert registry.spec("spiel:connect_four").observation_shape == (3, 6, 7)  # observation only


def test_spiel_falls_back_to_information_state_tensors():
    game = make_spiel_game("battleship")  # provides information-state tensors only
    assert observation_kind(game.game) == "information_state"
    game.reset(0)
    seat = game.to_move()[0]
    expected = np.asarray(game.state.information_state_tensor(seat), dtype=np.float32)
    np.testing.assert_array_equal(game.observation(seat).reshape(-1), expected)
    assert game.observation(seat).shape == game.spec.observation_shape


def test_spiel_game_is_loaded_once_and_state_is_exposed():
    assert load_spiel_game("kuhn_poker") is load_spiel_game("kuhn_poker")
    game = make_spiel_game("tic_tac_toe")
    game.reset(0)
    game.step({0: 4})
    assert isinstance(game.state, pyspiel.State) and game.state.history() == [4]
    assert game.render() == str(game.state)


def test_spiel_illegal_action_is_refused():
    game = make_spiel_game("tic_tac_toe")
    game.reset(0)
    game.step({0: 4})
    with pytest.raises(GameError, match="illegal"):
        game.step({1: 4})


@pytest.mark.parametrize("game_id, hint", [
    ("spiel:kuhn_pokr", "spiel:kuhn_poker"),
    ("spiel:conect_four", "spiel:connect_four"),
    ("spiel:kuhn_poker(player=3)", "'players'"),
    ("spiel:kuhn_poker(players=x)", "must be an integer"),
    ("spiel:kuhn_poker(players=30)", "max_num_players"),
    ("spiel:goofspiel(num_cards=4", "malformed"),
    ("spiel:negotiation", "cannot replay"),
])
def test_spiel_bad_ids_raise_game_error_with_a_hint(game_id, hint):
    with pytest.raises(GameError) as info:
        registry.make(game_id)
    message = str(info.value)
    assert hint in message and "\n" not in message


# --- PettingZoo ----------------------------------------------------------------------------------

def test_pz_tictactoe_is_turn_based_and_zero_sum():
    game = registry.make("pz:pettingzoo.classic.tictactoe_v3")
    spec = game.spec
    assert (spec.num_players, spec.num_actions, spec.observation_shape) == (2, 9, (18,))
    assert spec.zero_sum and not spec.simultaneous and spec.max_length == 9
    rng = np.random.default_rng(4)
    seen = set()
    for seed in range(60):
        total, movers = play_random(game, seed, rng)
        assert all(len(m) == 1 for m in movers)
        assert [m[0] for m in movers] == [i % 2 for i in range(len(movers))]
        np.testing.assert_array_equal(total, game.returns())
        seen.add(tuple(float(r) for r in game.returns()))
    assert seen <= {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)} and len(seen) >= 2


def test_pz_texas_holdem_steps_finished_agents_and_stays_zero_sum():
    game = registry.make("pz:pettingzoo.classic.texas_holdem_v4")
    assert game.spec.has_chance and not game.spec.perfect_information
    rng = np.random.default_rng(5)
    for seed in range(40):
        total, _ = play_random(game, seed, rng)
        assert game.is_terminal() and not game.is_truncated()
        assert abs(total.sum()) < 1e-9
        assert np.all(np.abs(total) <= 25.0)
        np.testing.assert_allclose(total, game.returns(), atol=1e-6)


def test_pz_mpe_is_parallel_cooperative_and_truncated_at_max_cycles():
    game = registry.make("pz:mpe2.simple_spread_v3")
    spec = game.spec
    assert spec.simultaneous and spec.num_players == 3 and spec.num_actions == 5
    assert spec.teams == (0, 0, 0) and not spec.zero_sum and spec.utility_sum is None
    assert spec.state_shape == (54,) and spec.max_length == 25
    total, movers = play_random(game, 7, np.random.default_rng(6))
    assert movers == [(0, 1, 2)] * 25
    assert game.is_truncated() and not game.is_terminal() and game.to_move() == ()
    assert game.global_state().shape == (54,)
    np.testing.assert_allclose(total, game.returns(), atol=1e-5)
    assert len(game.history()) == 75


def test_pz_rock_paper_scissors_ends_by_its_rules_not_by_truncation():
    """PettingZoo truncates RPS after max_cycles rounds, but that is the game's end: terminal, so
    a learner's last step has no bootstrap value (mpe, by contrast, is truncated: see above)."""
    game = registry.make("pz:pettingzoo.classic.rps_v2(max_cycles=4)")
    game.reset(0)
    steps = 0
    while not is_over(game):
        game.step({seat: int(np.flatnonzero(game.legal_mask(seat))[steps % 3]) for seat in game.to_move()})
        steps += 1
    assert steps == 4 and game.is_terminal() and not game.is_truncated()
    assert game.spec.zero_sum and game.returns().sum() == 0


def test_pz_parameters_reach_the_constructor():
    game = make_pettingzoo_game("mpe2.simple_spread_v3(N=2,max_cycles=5)")
    assert game.spec.id == "pz:mpe2.simple_spread_v3(N=2,max_cycles=5)"
    assert game.spec.num_players == 2 and game.spec.max_length == 5 and game.spec.teams == (0, 0)
    _, movers = play_random(game, 0, np.random.default_rng(0))
    assert len(movers) == 5


def test_pz_illegal_action_is_refused():
    game = registry.make("pz:pettingzoo.classic.tictactoe_v3")
    game.reset(0)
    game.step({0: 4})
    with pytest.raises(GameError, match="illegal"):
        game.step({1: 4})


@pytest.mark.parametrize("game_id, hint", [
    ("pz:pettingzoo.classic.tictactoe_v2", "pz:pettingzoo.classic.tictactoe_v3"),
    ("pz:mpe2.simple_spread_v3(continuous_actions=True)", "Discrete"),
    ("pz:mpe2.simple_spread_v3(no_such_option=1)", "bad parameters"),
    ("pz:json", "neither env() nor parallel_env()"),
])
def test_pz_bad_ids_raise_game_error(game_id, hint):
    with pytest.raises(GameError) as info:
        registry.make(game_id)
    assert hint in str(info.value) and "\n" not in str(info.value)


# --- Gymnasium -----------------------------------------------------------------------------------

def test_gym_cartpole_is_a_one_player_game():
    game = registry.make("gym:CartPole-v1")
    spec = game.spec
    assert (spec.num_players, spec.num_actions, spec.observation_shape) == (1, 2, (4,))
    assert not spec.zero_sum and spec.utility_sum is None and spec.max_length == 500
    total, movers = play_random(game, 0, np.random.default_rng(8))
    assert game.is_terminal() and not game.is_truncated()
    assert total[0] == len(movers) == game.returns()[0]  # +1 per step
    assert isinstance(game.render(), str)


def test_gym_time_limit_is_a_truncation():
    game = make_gym_game("MountainCar-v0")  # random play never reaches the flag in 200 steps
    total, movers = play_random(game, 0, np.random.default_rng(9))
    assert len(movers) == 200 and game.is_truncated() and not game.is_terminal()
    assert total[0] == -200.0 == game.returns()[0]
    assert game.to_move() == () and not game.legal_mask(0).any()


@pytest.mark.parametrize("game_id, hint", [
    ("gym:CartPole-v9", "gym:CartPole-v1"),
    ("gym:CartPol-v1", "gym:CartPole-v1"),
    ("gym:Pendulum-v1", "Discrete"),
])
def test_gym_bad_ids_raise_game_error(game_id, hint):
    with pytest.raises(GameError) as info:
        registry.make(game_id)
    assert hint in str(info.value) and "\n" not in str(info.value)


def test_a_gym_env_missing_its_dependency_is_one_line():
    """gym:LunarLander-v3 needs Box2D, which Ludus does not install: exit 2 and one line with the hint."""
    import importlib.util
    import subprocess
    import sys

    assert importlib.util.find_spec("Box2D") is None, "Box2D is installed here: pick another env for this test"
    result = subprocess.run([sys.executable, "-m", "ludus", "games", "--check", "gym:LunarLander-v3"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "LunarLander-v3" in lines[0] and "box2d" in lines[0].lower(), result.stderr


def test_a_snapshot_saved_on_the_old_observation_is_refused_in_one_line(tmp_path):
    import dataclasses

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import Lineage, SnapshotError, load_snapshot, save_snapshot

    old = dataclasses.replace(registry.spec("spiel:kuhn_poker[observation]"), id="spiel:kuhn_poker")
    save_snapshot(ActorCritic(old, NetConfig(hidden=(8,))), old, NetConfig(hidden=(8,)), tmp_path / "s",
                  Lineage(role="t"))
    with pytest.raises(SnapshotError, match=r"shape \(7,\), spiel:kuhn_poker gives \(11,\)") as info:
        load_snapshot(tmp_path / "s", expect_game="spiel:kuhn_poker")
    assert "\n" not in str(info.value)
