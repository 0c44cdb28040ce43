"""GAE and per-seat trajectories on literal arrays, checked against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from ludus.agents.rollout import RolloutBatch, SeatTrajectoryBuilder, compute_gae
from ludus.games.core import TimeStep

NUM_ACTIONS = 3


def timestep(acting, rewards=None, done=None, truncated=None, obs_ids=None) -> TimeStep:
    """A TimeStep for B slots x P seats; each acting seat's observation is the single number obs_ids[b][p]."""
    acting = np.array(acting, dtype=bool)
    b, p = acting.shape
    obs = np.zeros((b, p, 1), dtype=np.float32)
    if obs_ids is not None:
        obs[..., 0] = np.array(obs_ids, dtype=np.float32)
    mask = np.zeros((b, p, NUM_ACTIONS), dtype=bool)
    mask[acting] = True
    return TimeStep(
        obs=obs, mask=mask, acting=acting,
        rewards=np.zeros((b, p), np.float32) if rewards is None else np.array(rewards, np.float32),
        done=np.zeros(b, bool) if done is None else np.array(done, bool),
        truncated=np.zeros(b, bool) if truncated is None else np.array(truncated, bool),
        final_returns=np.zeros((b, p), np.float32), final_lengths=np.zeros(b, np.int64))


def builder_for(num_games: int, num_players: int) -> SeatTrajectoryBuilder:
    return SeatTrajectoryBuilder(num_games, num_players, (1,), NUM_ACTIONS, capacity=2)


def act(builder, ts, values, record, actions=None, version=0):
    values = np.array(values, np.float32)
    actions = np.zeros(values.shape, np.int64) if actions is None else np.array(actions)
    builder.record_actions(ts, actions, np.full(values.shape, -1.0, np.float32), values, np.array(record), version)


# ----------------------------------------------------------------------------------------------
# compute_gae


def test_gae_matches_hand_computation_without_dones():
    # gamma 0.5, lambda 0.5; bootstrap V(s_3) = 4.
    # delta_2 = 1 + 0.5*4 - 3 = 0;  delta_1 = 1 + 0.5*3 - 2 = 0.5;  delta_0 = 1 + 0.5*2 - 1 = 1
    # A_2 = 0;  A_1 = 0.5 + 0.25*0 = 0.5;  A_0 = 1 + 0.25*0.5 = 1.125
    advantages, returns = compute_gae(rewards=[1, 1, 1], values=[1, 2, 3], dones=[0, 0, 0],
                                      bootstrap_values=[0, 0, 4], gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose(advantages, [1.125, 0.5, 0.0])
    np.testing.assert_allclose(returns, [2.125, 2.5, 3.0])


def test_gae_terminal_cuts_and_does_not_bootstrap():
    # Episode ends (terminal) after t=1; a new one starts at t=2 and the data stops after t=2.
    # delta_2 = 2 + 0.5*10 - 3 = 4;  A_2 = 4
    # delta_1 = 0 + 0 - 2 = -2 (terminal: bootstrap 0, not values[2]);  A_1 = -2
    # delta_0 = 1 + 0.5*2 - 1 = 1;  A_0 = 1 + 0.25*(-2) = 0.5
    advantages, returns = compute_gae(rewards=[1, 0, 2], values=[1, 2, 3], dones=[0, 1, 0],
                                      bootstrap_values=[99, 0, 10], gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose(advantages, [0.5, -2.0, 4.0])
    np.testing.assert_allclose(returns, [1.5, 0.0, 7.0])


def test_gae_truncation_bootstraps_from_given_value():
    # Truncated after t=0 with V(s_1) = 6 given:  delta_0 = 1 + 0.5*6 - 1 = 3
    advantages, returns = compute_gae(rewards=[1, 0], values=[1, 8], dones=[1, 0],
                                      bootstrap_values=[6, 0], gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose(advantages, [3.0, -8.0])
    np.testing.assert_allclose(returns, [4.0, 0.0])


def test_gae_equals_the_sequential_recursion_on_mixed_sequences():
    """All sequences at once (recursive doubling) == CleanRL's backward loop, row by row: short
    and long sequences, terminal and cut ends, one sequence running over the whole array."""
    rng = np.random.default_rng(7)
    for num_steps, stop_rate in [(1, 0.0), (2, 0.5), (37, 0.2), (500, 0.05), (3000, 0.0), (4000, 0.3)]:
        rewards, values, bootstrap = rng.normal(size=(3, num_steps))
        dones, ends = rng.random((2, num_steps)) < stop_rate
        gamma, lam = 0.99, 0.95
        expected = np.zeros(num_steps)
        following = 0.0
        for t in reversed(range(num_steps)):
            stop = dones[t] or ends[t] or t == num_steps - 1
            next_value = bootstrap[t] if stop else values[t + 1]
            following = rewards[t] + gamma * next_value - values[t] + (0.0 if stop else gamma * lam * following)
            expected[t] = following
        advantages, returns = compute_gae(rewards, values, dones, bootstrap, gamma, lam, sequence_ends=ends)
        np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(returns, expected + values, rtol=1e-5, atol=1e-5)


def test_gae_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        compute_gae([1, 2], [1], [0, 0], [0, 0], 0.9, 0.9)


# ----------------------------------------------------------------------------------------------
# SeatTrajectoryBuilder


def rows_of(batch: RolloutBatch, slot: int, seat: int) -> np.ndarray:
    return np.flatnonzero((batch.slots == slot) & (batch.seats == seat))


def test_loss_on_opponents_move_is_credited_to_learners_last_transition():
    """Two players, one slot. Seat 0 moves, seat 1 moves, seat 0 moves, seat 1 wins (-1/+1)."""
    builder = builder_for(1, 2)
    ts = timestep([[1, 0]], obs_ids=[[10, 0]])
    act(builder, ts, [[0.5, 0]], [[1, 1]])
    ts = timestep([[0, 1]], rewards=[[0, 0]], obs_ids=[[0, 20]])
    builder.record_outcome(ts)
    act(builder, ts, [[0, 0.2]], [[1, 1]])
    ts = timestep([[1, 0]], rewards=[[0, 0]], obs_ids=[[11, 0]])
    builder.record_outcome(ts)
    act(builder, ts, [[0.6, 0]], [[1, 1]])
    ts = timestep([[0, 1]], rewards=[[0, 0]], obs_ids=[[0, 21]])
    builder.record_outcome(ts)
    act(builder, ts, [[0, 0.3]], [[1, 1]])
    # Seat 1's move ends the game: seat 0 gets -1 although it did not move; auto-reset gives a new game.
    ts = timestep([[1, 0]], rewards=[[-1, 1]], done=[1], obs_ids=[[12, 0]])
    builder.record_outcome(ts)
    batch = builder.build(ts, None, gamma=0.9, gae_lambda=0.8)

    learner = rows_of(batch, 0, 0)
    np.testing.assert_array_equal(batch.obs[learner, 0], [10, 11])
    np.testing.assert_array_equal(batch.rewards[learner], [0, -1])
    np.testing.assert_array_equal(batch.dones[learner], [False, True])
    # delta_1 = -1 + 0 - 0.6 = -1.6;                A_1 = -1.6
    # delta_0 = 0 + 0.9*0.6 - 0.5 = 0.04;           A_0 = 0.04 + 0.9*0.8*(-1.6) = -1.112
    np.testing.assert_allclose(batch.advantages[learner], [-1.112, -1.6], rtol=1e-6)
    np.testing.assert_allclose(batch.returns[learner], [-0.612, -1.0], rtol=1e-6)

    opponent = rows_of(batch, 0, 1)
    np.testing.assert_array_equal(batch.obs[opponent, 0], [20, 21])
    np.testing.assert_array_equal(batch.rewards[opponent], [0, 1])
    # delta_1 = 1 - 0.3 = 0.7;  delta_0 = 0.9*0.3 - 0.2 = 0.07;  A_0 = 0.07 + 0.72*0.7 = 0.574
    np.testing.assert_allclose(batch.advantages[opponent], [0.574, 0.7], rtol=1e-6)
    assert len(batch) == 4 and builder.num_open == 0


def test_only_recorded_seats_are_kept():
    builder = builder_for(1, 2)
    ts = timestep([[1, 0]], obs_ids=[[10, 0]])
    act(builder, ts, [[0.5, 0]], [[1, 0]])
    ts = timestep([[0, 1]], obs_ids=[[0, 20]])
    builder.record_outcome(ts)
    act(builder, ts, [[0, 0.2]], [1, 0])  # [P] record mask: the same seats in every slot
    ts = timestep([[1, 0]], rewards=[[-1, 1]], done=[1], obs_ids=[[12, 0]])
    builder.record_outcome(ts)
    batch = builder.build(ts, None, gamma=0.9, gae_lambda=0.8)
    np.testing.assert_array_equal(batch.seats, [0])
    np.testing.assert_array_equal(batch.rewards, [-1])
    np.testing.assert_allclose(batch.advantages, [-1.5])  # -1 - 0.5, terminal


def test_auto_reset_in_the_middle_of_a_batch_does_not_bootstrap_across_games():
    """Two single-player slots; slot 0's game ends (terminal) after its 2nd step, slot 1's does not."""
    builder = builder_for(2, 1)
    ts = timestep([[1], [1]], obs_ids=[[1], [101]])
    act(builder, ts, [[1.0], [10.0]], [[1], [1]])
    ts = timestep([[1], [1]], rewards=[[1], [0]], obs_ids=[[2], [102]])
    builder.record_outcome(ts)
    act(builder, ts, [[2.0], [20.0]], [[1], [1]])
    ts = timestep([[1], [1]], rewards=[[1], [0]], done=[1, 0], obs_ids=[[3], [103]])  # slot 0 reset
    builder.record_outcome(ts)
    act(builder, ts, [[3.0], [30.0]], [[1], [1]])
    ts = timestep([[1], [1]], rewards=[[1], [0]], obs_ids=[[4], [104]])
    builder.record_outcome(ts)
    act(builder, ts, [[4.0], [40.0]], [[1], [1]])
    ts = timestep([[1], [1]], rewards=[[1], [5]], obs_ids=[[5], [105]])
    builder.record_outcome(ts)
    batch = builder.build(ts, np.array([[5.0], [50.0]]), gamma=0.5, gae_lambda=0.5)

    slot0 = rows_of(batch, 0, 0)
    np.testing.assert_array_equal(batch.obs[slot0, 0], [1, 2, 3, 4])
    np.testing.assert_array_equal(batch.dones[slot0], [False, True, False, False])
    # t1 ends the game: delta_1 = 1 - 2 = -1 (not 1 + 0.5*3 - 2);  A_1 = -1
    # delta_0 = 1 + 0.5*2 - 1 = 1;  A_0 = 1 + 0.25*(-1) = 0.75
    # t3 bootstraps from V = 5: delta_3 = 1 + 2.5 - 4 = -0.5;  A_3 = -0.5
    # delta_2 = 1 + 0.5*4 - 3 = 0;  A_2 = 0 + 0.25*(-0.5) = -0.125
    np.testing.assert_allclose(batch.advantages[slot0], [0.75, -1.0, -0.125, -0.5])
    np.testing.assert_allclose(batch.returns[slot0], [1.75, 1.0, 2.875, 3.5])

    slot1 = rows_of(batch, 1, 0)
    np.testing.assert_array_equal(batch.obs[slot1, 0], [101, 102, 103, 104])
    np.testing.assert_array_equal(batch.rewards[slot1], [0, 0, 0, 5])
    assert not batch.dones[slot1].any()
    # deltas: 0.5*20-10 = 0, 0.5*30-20 = -5, 0.5*40-30 = -10, 5+0.5*50-40 = -10
    # A_3 = -10; A_2 = -10 - 2.5 = -12.5; A_1 = -5 - 3.125 = -8.125; A_0 = 0 - 2.03125
    np.testing.assert_allclose(batch.advantages[slot1], [-2.03125, -8.125, -12.5, -10.0])


def test_truncation_bootstraps_from_the_seats_value():
    builder = builder_for(1, 1)
    ts = timestep([[1]], obs_ids=[[1]])
    act(builder, ts, [[1.0]], [[1]])
    ts = timestep([[1]], rewards=[[1]], obs_ids=[[2]])
    builder.record_outcome(ts)
    act(builder, ts, [[3.0]], [[1]])
    ts = timestep([[1]], rewards=[[1]], done=[1], truncated=[1], obs_ids=[[9]])
    builder.record_outcome(ts)
    batch = builder.build(ts, np.array([[100.0]]), gamma=0.5, gae_lambda=0.5)
    # The cut transition bootstraps from the seat's own last value, 3 (not 0, not the new game's 100):
    # delta_1 = 1 + 0.5*3 - 3 = -0.5;  A_1 = -0.5
    # delta_0 = 1 + 0.5*3 - 1 = 1.5;   A_0 = 1.5 + 0.25*(-0.5) = 1.375
    np.testing.assert_array_equal(batch.dones, [False, True])
    np.testing.assert_allclose(batch.advantages, [1.375, -0.5])
    np.testing.assert_allclose(batch.returns, [2.375, 2.5])


def test_open_transition_of_a_waiting_seat_carries_into_the_next_batch():
    """The rollout stops while the learner waits for the opponent: its transition stays open."""
    builder = builder_for(1, 2)
    ts = timestep([[1, 0]], obs_ids=[[10, 0]])
    act(builder, ts, [[0.5, 0]], [[1, 0]], version=3)
    ts = timestep([[0, 1]], obs_ids=[[0, 20]])
    builder.record_outcome(ts)
    first = builder.build(ts, np.zeros((1, 2)), gamma=0.9, gae_lambda=0.8)
    assert len(first) == 0 and builder.num_open == 1

    act(builder, ts, [[0, 0.2]], [[1, 0]], version=4)  # opponent moves, unrecorded
    ts = timestep([[1, 0]], rewards=[[-1, 1]], done=[1], obs_ids=[[12, 0]])
    builder.record_outcome(ts)
    second = builder.build(ts, np.zeros((1, 2)), gamma=0.9, gae_lambda=0.8)
    np.testing.assert_array_equal(second.obs[:, 0], [10])
    np.testing.assert_array_equal(second.policy_version, [3])  # the behaviour version it was played with
    np.testing.assert_array_equal(second.rewards, [-1])
    np.testing.assert_array_equal(second.dones, [True])
    np.testing.assert_allclose(second.advantages, [-1.5])


def test_bootstrap_none_keeps_the_acting_seats_transition_open():
    builder = builder_for(1, 1)
    ts = timestep([[1]], obs_ids=[[1]])
    act(builder, ts, [[1.0]], [[1]])
    ts = timestep([[1]], rewards=[[2]], obs_ids=[[2]])
    builder.record_outcome(ts)
    assert len(builder.build(ts, None, gamma=0.5, gae_lambda=0.5)) == 0
    act(builder, ts, [[4.0]], [[1]])  # closes the carried transition with V = 4
    batch = builder.build(ts, None, gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose(batch.advantages, [2 + 0.5 * 4 - 1])


def test_dialogue_seat_acting_several_steps_in_a_row():
    """Seat 0 says three tokens, seat 1 one, the game ends with rewards 3 / 1."""
    builder = builder_for(1, 2)
    for token, obs_id in enumerate([10, 11, 12]):
        ts = timestep([[1, 0]], obs_ids=[[obs_id, 0]])
        if token:
            builder.record_outcome(ts)
        act(builder, ts, [[obs_id / 10, 0]], [[1, 1]], actions=[[token, 0]])
    ts = timestep([[0, 1]], obs_ids=[[0, 20]])
    builder.record_outcome(ts)
    act(builder, ts, [[0, 2.0]], [[1, 1]])
    ts = timestep([[1, 0]], rewards=[[3, 1]], done=[1], obs_ids=[[30, 0]])
    builder.record_outcome(ts)
    batch = builder.build(ts, None, gamma=1.0, gae_lambda=1.0)
    talker = rows_of(batch, 0, 0)
    np.testing.assert_array_equal(batch.actions[talker], [0, 1, 2])
    np.testing.assert_array_equal(batch.rewards[talker], [0, 0, 3])
    np.testing.assert_array_equal(batch.dones[talker], [False, False, True])
    # gamma = lambda = 1: A_t = (sum of later rewards) - V(s_t) = 3 - V
    np.testing.assert_allclose(batch.advantages[talker], [3 - 1.0, 3 - 1.1, 3 - 1.2], rtol=1e-6)
    np.testing.assert_allclose(batch.advantages[rows_of(batch, 0, 1)], [1 - 2.0])


def test_simultaneous_moves_open_one_transition_per_seat():
    builder = builder_for(1, 2)
    ts = timestep([[1, 1]], obs_ids=[[10, 20]])
    act(builder, ts, [[1.0, 2.0]], [[1, 1]], actions=[[1, 2]])
    ts = timestep([[1, 1]], rewards=[[1, -1]], obs_ids=[[11, 21]])
    builder.record_outcome(ts)
    act(builder, ts, [[1.5, 2.5]], [[1, 1]], actions=[[0, 0]])
    ts = timestep([[1, 1]], rewards=[[0, 4]], done=[1], obs_ids=[[12, 22]])
    builder.record_outcome(ts)
    batch = builder.build(ts, None, gamma=1.0, gae_lambda=1.0)
    np.testing.assert_array_equal(batch.seats, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.obs[:, 0], [10, 11, 20, 21])
    np.testing.assert_array_equal(batch.actions, [1, 0, 2, 0])
    np.testing.assert_array_equal(batch.rewards, [1, 0, -1, 4])
    np.testing.assert_allclose(batch.advantages, [1 - 1.0, 0 - 1.5, 3 - 2.0, 4 - 2.5])


def test_changing_the_record_flag_mid_game_is_refused():
    builder = builder_for(1, 1)
    ts = timestep([[1]], obs_ids=[[1]])
    act(builder, ts, [[1.0]], [[1]])
    builder.record_outcome(timestep([[1]]))
    with pytest.raises(ValueError, match="record"):
        act(builder, timestep([[1]]), [[1.0]], [[0]])


def test_builder_never_mixes_slots_or_seats_on_a_real_game():
    """Random tic-tac-toe in 3 slots, both seats recorded: every seat-sequence holds only its own
    observations and its rewards over finished games add up to the games' final returns."""
    from ludus.games.registry import make_vector

    games = make_vector("spiel:tic_tac_toe", 3, seed=7)
    spec = games.spec
    builder = SeatTrajectoryBuilder(3, 2, spec.observation_shape, spec.num_actions, spec.observation_dtype)
    rng = np.random.default_rng(0)
    ts = games.reset(games.seed_source(3))
    final_sums = np.zeros((3, 2))
    seen: dict[tuple[int, int], list[np.ndarray]] = {(b, p): [] for b in range(3) for p in range(2)}
    for step in range(60):
        actions = np.zeros((3, 2), np.int64)
        for b, p in zip(*np.nonzero(ts.acting)):
            actions[b, p] = rng.choice(np.flatnonzero(ts.mask[b, p]))
            seen[b, p].append(ts.obs[b, p].copy())
        values = rng.random((3, 2)).astype(np.float32)
        builder.record_actions(ts, actions, np.zeros((3, 2), np.float32), values, np.ones((3, 2), bool), step)
        ts = games.step(actions)
        builder.record_outcome(ts)
        final_sums += np.where(ts.done[:, None], ts.final_returns, 0.0)
    batch = builder.build(ts, None, gamma=0.99, gae_lambda=0.95)
    assert batch.dones.sum() > 0
    for b in range(3):
        for p in range(2):
            rows = rows_of(batch, b, p)
            assert np.all(np.diff(batch.policy_version[rows]) > 0)  # time order, one row per own turn
            # Each (slot, seat) gets back exactly what it saw, in order (open transitions excepted).
            np.testing.assert_array_equal(batch.obs[rows], np.array(seen[b, p][:len(rows)]))
            # Rewards of finished games only (rows up to the last done of this sequence).
            finished = rows[: np.flatnonzero(batch.dones[rows])[-1] + 1] if batch.dones[rows].any() else []
            assert batch.rewards[finished].sum() == pytest.approx(final_sums[b, p])
    assert np.all(batch.mask[np.arange(len(batch)), batch.actions])
