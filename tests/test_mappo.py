"""MAPPO: critic and actor inputs, done-agent masking, ValueNorm, determinism, rollouts on MPE
simple_spread, the scripted reference policy, and (slow) learning over random."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ludus.agents.rl.cooperative import evaluate_policy, train_cooperative
from ludus.agents.rl.mappo import (
    MAPPOBatch,
    MAPPOConfig,
    MAPPOLearner,
    ValueNorm,
    actor_inputs,
    critic_inputs,
    input_sizes,
)
from ludus.agents.rl.mappo_rollout import collect_rollout
from ludus.agents.bots.mpe_scripted import (
    SpreadScriptedPolicy,
    optimal_assignment,
    spread_scripted_actions,
)
from ludus.agents.policy import RandomPolicy
from ludus.agents.ppo_core import weighted_mean
from ludus.agents.rollout import compute_gae
from ludus.agents.threads import torch_threads
from ludus.games.core import GameSpec, TimeStep
from ludus.games.registry import make_vector

SPREAD = "pz:mpe2.simple_spread_v3"
TINY_SPEC = GameSpec(id="test:team", num_players=3, num_actions=4, observation_shape=(2,), teams=(0, 0, 0),
                     zero_sum=False, utility_sum=None, simultaneous=True)
TINY_CONFIG = MAPPOConfig(hidden=(16,), update_epochs=3)
TEAM = TINY_SPEC.team_of_seat


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny nets: with busy cores a second torch thread makes each update ~20x slower."""
    with torch_threads(1):
        yield


def literal_obs(batch: int = 2) -> np.ndarray:
    """[B, 3, 2] observations with distinct entries."""
    return np.arange(batch * 3 * 2, dtype=np.float32).reshape(batch, 3, 2) / 10.0


# ------------------------------------------------------------------------------------- inputs


def test_centralised_critic_input_is_the_games_global_state():
    games = make_vector(SPREAD, 2, seed=3)
    ts = games.reset(games.seed_source(2))
    spec = games.spec
    state = games.global_states()
    assert spec.state_shape == (54,) and state.shape == (2, 54)
    config = MAPPOConfig()
    critic = critic_inputs(ts.obs, state, config, spec.team_of_seat)
    actor = actor_inputs(ts.obs, config)
    assert critic.shape == (2, 3, 54 + 3) and actor.shape == (2, 3, 18)
    assert (actor.shape[-1], critic.shape[-1]) == input_sizes(spec, config)
    for b in range(2):
        for seat in range(3):
            assert np.array_equal(critic[b, seat, :54], games.games[b].global_state())
            assert np.array_equal(critic[b, seat, 54:], np.eye(3, dtype=np.float32)[seat])
            assert np.array_equal(actor[b, seat], ts.obs[b, seat])
    # mpe2's state is every agent's observation, concatenated.
    assert np.allclose(state, ts.obs.reshape(2, 54))


def test_another_agents_observation_reaches_the_critic_but_not_the_actor():
    config = MAPPOConfig()
    obs = literal_obs()
    changed = obs.copy()
    changed[:, 1] += 5.0  # seat 1 sees something else
    critic_before, critic_after = (critic_inputs(o, None, config, TEAM) for o in (obs, changed))
    actor_before, actor_after = actor_inputs(obs, config), actor_inputs(changed, config)
    assert critic_before.shape == (2, 3, 3 * 2 + 3)
    assert not np.array_equal(critic_before[:, 0], critic_after[:, 0])  # seat 0's critic sees seat 1
    assert np.array_equal(actor_before[:, 0], actor_after[:, 0])  # seat 0's actor does not
    assert np.array_equal(actor_before[:, 2], actor_after[:, 2])
    # Without a game state the centralised input is the side's observations (here one side of three).
    assert np.array_equal(critic_before[:, 0, :6], obs.reshape(2, 6))


def test_without_a_global_state_a_seat_s_critic_reads_its_own_side_only():
    """Two sides of two seats and no game state: each seat's centralised input is its side's
    observations in seat order (the view league runners record), then its id — never the other
    side's observations."""
    obs = np.arange(2 * 4 * 2, dtype=np.float32).reshape(2, 4, 2)
    critic = critic_inputs(obs, None, MAPPOConfig(), (0, 1, 0, 1))
    assert critic.shape == (2, 4, 2 * 2 + 4)
    for seat, side in ((0, [0, 2]), (1, [1, 3]), (2, [0, 2]), (3, [1, 3])):
        assert np.array_equal(critic[:, seat, :4], obs[:, side].reshape(2, 4))
        assert np.array_equal(critic[:, seat, 4:], np.repeat(np.eye(4, dtype=np.float32)[seat][None], 2, axis=0))


def test_agent_specific_critic_input_puts_the_own_observation_before_the_global_state():
    """`critic_own_observation` (Yu et al. 2022's agent-specific global state): the same state for
    every seat, after the seat's own observation, then its id; the league's rows read alike."""
    from ludus.agents.rl.mappo import critic_rows

    config = MAPPOConfig(critic_own_observation=True)
    obs, state = literal_obs(), np.arange(14, dtype=np.float32).reshape(2, 7)
    critic = critic_inputs(obs, state, config, TEAM)
    assert critic.shape == (2, 3, 2 + 7 + 3)
    for seat in range(3):
        assert np.array_equal(critic[:, seat, :2], obs[:, seat])
        assert np.array_equal(critic[:, seat, 2:9], state)
        assert np.array_equal(critic[:, seat, 9:], np.repeat(np.eye(3, dtype=np.float32)[seat][None], 2, axis=0))
    rows = critic_rows(obs.reshape(6, 2), np.repeat(state, 3, axis=0), np.tile(np.arange(3), 2), config, 3)
    assert np.array_equal(rows, critic.reshape(6, -1))
    # without a game state the global part is every observation, as without the option
    assert np.array_equal(critic_inputs(obs, None, config, TEAM)[:, :, 2:],
                          critic_inputs(obs, None, MAPPOConfig(), TEAM))
    assert input_sizes(TINY_SPEC, config) == (2, 2 + 3 * 2 + 3)
    # IPPO's critic reads the own observation only, with or without the option
    local = dataclasses.replace(config, critic_input="local")
    assert np.array_equal(critic_inputs(obs, state, local, TEAM),
                          critic_inputs(obs, state, MAPPOConfig(critic_input="local"), TEAM))


def test_ippo_critic_reads_the_local_observation_only():
    config = MAPPOConfig(critic_input="local")
    obs = literal_obs()
    changed = obs.copy()
    changed[:, 1] += 5.0
    state = np.ones((2, 7), np.float32)  # ignored by the local critic
    local, local_changed = critic_inputs(obs, state, config, TEAM), critic_inputs(changed, state, config, TEAM)
    assert local.shape == (2, 3, 2 + 3)
    for seat in range(3):
        assert np.array_equal(local[:, seat, :2], obs[:, seat])
    assert np.array_equal(local[:, 0], local_changed[:, 0])
    assert not np.array_equal(local[:, 1], local_changed[:, 1])
    assert input_sizes(TINY_SPEC, config) == (2, 5)


# ------------------------------------------------------------------------------------- the learner


def tiny_batch(learner: MAPPOLearner, active: np.ndarray, seed: int = 0) -> MAPPOBatch:
    rng = np.random.default_rng(seed)
    n = len(active)
    actor_size, critic_size = learner.actor.input_size, learner.critic.input_size
    actor_obs = rng.normal(size=(n, actor_size)).astype(np.float32)
    mask = np.ones((n, 4), bool)
    actions = rng.integers(0, 4, n)
    with torch.no_grad():
        log_pi = torch.log_softmax(learner.actor(torch.from_numpy(actor_obs), torch.from_numpy(mask)), -1).numpy()
    values = rng.normal(size=n).astype(np.float32)
    advantages = rng.normal(size=n).astype(np.float32)
    return MAPPOBatch(actor_obs=actor_obs, critic_obs=rng.normal(size=(n, critic_size)).astype(np.float32),
                      mask=mask, actions=actions, logprobs=log_pi[np.arange(n), actions].astype(np.float32),
                      values=values, rewards=np.zeros(n, np.float32), advantages=advantages,
                      returns=advantages + values,
                      active=np.asarray(active, np.float32), seats=np.arange(n) % 3)


def select(batch: MAPPOBatch, rows: np.ndarray) -> MAPPOBatch:
    return MAPPOBatch(**{f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(MAPPOBatch)})


def parameters(learner: MAPPOLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in [*learner.actor.parameters(), *learner.critic.parameters()]]


def test_weighted_mean_gives_inactive_rows_no_weight_and_no_gradient():
    x = torch.tensor([1.0, 2.0, 100.0, 3.0], requires_grad=True)
    active = torch.tensor([1.0, 1.0, 0.0, 1.0])
    loss = weighted_mean(x ** 2, active)
    assert loss.item() == pytest.approx((1 + 4 + 9) / 3)
    loss.backward()
    assert x.grad[2].item() == 0.0 and x.grad[0].item() != 0.0
    # padding may hold anything: a row of weight 0 never turns the mean into inf or NaN
    assert weighted_mean(torch.tensor([2.0, float("inf"), float("nan")]), torch.tensor([1.0, 0.0, 0.0])).item() == 2.0


def test_done_agents_carry_no_loss():
    """Rows of agents that are out (active 0) hold garbage; the update equals the one without them."""
    active = np.array([1, 1, 0, 1, 0, 1, 1, 0], np.float32)
    with_dead = tiny_batch(MAPPOLearner.for_game(TINY_SPEC, TINY_CONFIG, seed=1), active)
    garbage = dataclasses.replace(
        with_dead,
        advantages=np.where(active > 0, with_dead.advantages, 1e4).astype(np.float32),
        returns=np.where(active > 0, with_dead.returns, -1e4).astype(np.float32),
        logprobs=np.where(active > 0, with_dead.logprobs, -30.0).astype(np.float32))
    live_only = select(with_dead, np.flatnonzero(active))

    learners = [MAPPOLearner.for_game(TINY_SPEC, TINY_CONFIG, seed=1) for _ in range(2)]
    stats_dead = learners[0].update(garbage)
    stats_live = learners[1].update(live_only)
    assert stats_dead.active_rows == stats_live.active_rows == 5
    assert stats_dead.policy_loss == pytest.approx(stats_live.policy_loss, abs=1e-5)
    assert stats_dead.value_loss == pytest.approx(stats_live.value_loss, abs=1e-5)
    assert stats_dead.value_norm_mean == pytest.approx(float(live_only.returns.mean()), rel=1e-5)
    for a, b in zip(parameters(learners[0]), parameters(learners[1])):
        assert torch.allclose(a, b, atol=1e-5)


def test_update_is_deterministic_under_a_seed():
    config = dataclasses.replace(TINY_CONFIG, num_minibatches=2)
    results = []
    for _ in range(2):
        learner = MAPPOLearner.for_game(TINY_SPEC, config, seed=7)
        batch = tiny_batch(learner, np.ones(12), seed=3)
        stats = learner.update(batch)
        results.append((stats, parameters(learner)))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    other = MAPPOLearner.for_game(TINY_SPEC, config, seed=8)
    assert not all(torch.equal(a, b) for a, b in zip(results[0][1], parameters(other)))


def test_update_moves_the_policy_toward_positive_advantages():
    learner = MAPPOLearner.for_game(TINY_SPEC, dataclasses.replace(TINY_CONFIG, ent_coef=0.0), seed=0)
    batch = tiny_batch(learner, np.ones(8))
    sign = np.where(batch.actions == 0, 1.0, -1.0).astype(np.float32)
    batch = dataclasses.replace(batch, advantages=sign)
    obs, mask = torch.from_numpy(batch.actor_obs), torch.from_numpy(batch.mask)
    with torch.no_grad():
        before = torch.softmax(learner.actor(obs, mask), -1)[:, 0].mean().item()
    learner.update(batch)
    with torch.no_grad():
        after = torch.softmax(learner.actor(obs, mask), -1)[:, 0].mean().item()
    assert after > before


def test_value_norm_statistics():
    norm = ValueNorm(beta=0.9)
    first = torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)
    norm.update(first)
    mean, var = norm.mean_var()
    # Debiased: after one update the statistics are that batch's exactly.
    assert float(mean) == pytest.approx(3.0) and float(var) == pytest.approx(8.0 / 3.0)
    second = torch.tensor([10.0, 12.0], dtype=torch.float64)
    norm.update(second)
    mean, var = norm.mean_var()
    # EMA weights 0.9 * 0.1 (first) and 0.1 (second), normalised by 1 - 0.9^2.
    w1, w2 = 0.09 / 0.19, 0.1 / 0.19
    expected_mean = w1 * 3.0 + w2 * 11.0
    expected_sq = w1 * float((first ** 2).mean()) + w2 * float((second ** 2).mean())
    assert float(mean) == pytest.approx(expected_mean)
    assert float(var) == pytest.approx(expected_sq - expected_mean ** 2)
    x = torch.tensor([-4.0, 0.0, 7.5])
    assert torch.allclose(norm.denormalize(norm.normalize(x)), x, atol=1e-5)
    assert torch.allclose(norm.normalize(torch.tensor([expected_mean], dtype=torch.float32)),
                          torch.zeros(1), atol=1e-6)
    # A constant batch: variance floored at 1e-2 instead of dividing by zero.
    flat = ValueNorm()
    flat.update(torch.full((4,), 2.0))
    assert float(flat.mean_var()[1]) == pytest.approx(1e-2)


def test_state_dict_round_trip_resumes_exactly():
    learner = MAPPOLearner.for_game(TINY_SPEC, TINY_CONFIG, seed=2)
    learner.update(tiny_batch(learner, np.ones(6), seed=1))
    resumed = MAPPOLearner.for_game(TINY_SPEC, TINY_CONFIG, seed=99)
    resumed.load_state_dict(learner.state_dict())
    batch = tiny_batch(learner, np.ones(6), seed=2)
    assert learner.update(batch) == resumed.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(parameters(learner), parameters(resumed)))


# ------------------------------------------------------------------------------------- rollouts


@pytest.mark.parametrize("critic_input", ["global", "local"])
def test_rollout_on_simple_spread(critic_input):
    config = MAPPOConfig(critic_input=critic_input, num_envs=2, num_steps=30)
    games = make_vector(SPREAD, 2, seed=5)
    learner = MAPPOLearner.for_game(games.spec, config, seed=0)
    ts = games.reset(games.seed_source(2))
    rollout = collect_rollout(games, ts, {0: learner}, 30, np.random.default_rng(0), config)
    batch = rollout.batches[0]
    assert len(batch) == 30 * 2 * 3 and rollout.env_steps == 60
    assert batch.critic_obs.shape[1] == (54 + 3 if critic_input == "global" else 18 + 3)
    assert batch.active.min() == 1.0  # every MPE agent acts until its game ends
    # Every game hit max_cycles=25 once (a truncation) and restarted: one episode per slot.
    assert len(rollout.episodes.team_returns[0]) == 2 and np.all(rollout.episodes.lengths == 25)

    # GAE of slot 0, seat 1, by hand (rows are ordered [T, B, seat]).
    rows = np.arange(30) * 6 + 0 * 3 + 1
    values = batch.values[rows]
    dones = np.zeros(30, bool)
    dones[24] = True
    bootstrap = np.zeros(30, np.float32)
    bootstrap[24] = values[24]  # truncation: bootstrap from the seat's own last value estimate
    state = games.global_states() if critic_input == "global" else None
    bootstrap[29] = learner.values(critic_inputs(rollout.timestep.obs, state, config, TEAM)[0, 1:2])[0]
    advantages, returns = compute_gae(batch.rewards[rows], values, dones, bootstrap, config.gamma,
                                      config.gae_lambda)
    assert np.allclose(advantages, batch.advantages[rows], atol=1e-4)
    assert np.allclose(returns, batch.returns[rows], atol=1e-4)
    assert learner.update(batch).active_rows == 180


class LeavingSeatGame:
    """A fake 3-seat simultaneous VectorGame (one slot): 4 steps a game, seat 2 leaves after 2.

    Every acting seat gets reward 1 per step; the game ends by its rules (terminal) after step 4."""

    spec = GameSpec(id="test:leaving", num_players=3, num_actions=2, observation_shape=(2,), teams=(0, 0, 0),
                    zero_sum=False, utility_sum=None, simultaneous=True, max_length=4)
    num_games = 1

    def __init__(self):
        self.seed_source = lambda n: np.zeros(n, np.uint64)
        self.t = 0

    def _timestep(self, rewards, done):
        acting = np.array([[True, True, self.t < 2]])
        return TimeStep(obs=np.full((1, 3, 2), self.t, np.float32), mask=acting[:, :, None].repeat(2, axis=2),
                        acting=acting, rewards=np.asarray(rewards, np.float32).reshape(1, 3),
                        done=np.array([done]), truncated=np.array([False]),
                        final_returns=np.zeros((1, 3), np.float32), final_lengths=np.zeros(1, np.int64))

    def reset(self, seeds):
        self.t = 0
        return self._timestep(np.zeros(3), False)

    def step(self, actions):
        rewards = [1.0, 1.0, 1.0 if self.t < 2 else 0.0]
        self.t += 1
        done = self.t == 4
        if done:
            self.t = 0
        return self._timestep(rewards, done)


def test_rollout_masks_a_seat_that_left_and_ends_its_returns():
    config = MAPPOConfig(hidden=(8,), gamma=1.0, gae_lambda=1.0)
    games = LeavingSeatGame()
    learner = MAPPOLearner.for_game(games.spec, config, seed=0)
    rollout = collect_rollout(games, games.reset([0]), {0: learner}, 4, np.random.default_rng(0), config)
    batch = rollout.batches[0]
    by_seat = {seat: np.flatnonzero(batch.seats == seat) for seat in range(3)}  # rows in time order
    assert batch.active[by_seat[2]].tolist() == [1, 1, 0, 0]
    assert batch.active[by_seat[0]].tolist() == [1, 1, 1, 1]
    # gamma = lambda = 1: the return is the sum of the seat's remaining rewards, whatever the values.
    assert np.allclose(batch.returns[by_seat[0]], [4, 3, 2, 1], atol=1e-5)
    assert np.allclose(batch.returns[by_seat[2]], [2, 1, 0, 0], atol=1e-5)
    assert np.all(batch.advantages[by_seat[2]][2:] == 0)
    assert learner.update(batch).active_rows == 10


# ------------------------------------------------------------------------------------- reference policies


def test_optimal_assignment_brute_force():
    cost = np.array([[[1.0, 0.0, 9.0], [0.0, 1.0, 9.0], [9.0, 9.0, 0.5]],
                     [[5.0, 1.0, 1.0], [1.0, 5.0, 5.0], [5.0, 0.0, 5.0]]])
    assert optimal_assignment(cost).tolist() == [[1, 0, 2], [2, 0, 1]]


def test_scripted_policy_steers_toward_its_landmark():
    # N=3: [vel, pos, 3 landmarks, 2 others, comm]. Self at rest; its landmark (by assignment)
    # is far to the right; the others sit on the other two landmarks.
    obs = np.zeros(18, np.float32)
    obs[4:10] = [1.0, 0.0, -0.5, 1.0, -0.5, -1.0]  # landmarks rel: right, up-left, down-left
    obs[10:14] = [-0.5, 1.0, -0.5, -1.0]  # others on landmarks 1 and 2
    assert spread_scripted_actions(obs[None]).tolist() == [2]  # push +x
    moving = obs.copy()
    moving[0] = 2.0  # already racing right at 2.0: coasting covers 0.1*2 + 0.4*1.5 = 0.8 < 1.0
    assert spread_scripted_actions(moving[None]).tolist() == [2]
    arrived = obs.copy()
    arrived[0], arrived[4] = 1.5, 0.4  # 0.4 short at speed 1.5: coasting alone overshoots to 0.6
    assert spread_scripted_actions(arrived[None]).tolist() == [1]  # brake (push -x)


def test_scripted_policy_beats_random_on_simple_spread():
    random_result = evaluate_policy(SPREAD, RandomPolicy(), episodes=40, seed=11, num_envs=20)
    scripted_result = evaluate_policy(SPREAD, SpreadScriptedPolicy(), episodes=40, seed=11, num_envs=20)
    assert len(scripted_result.episode_returns) == 40
    assert scripted_result.mean > random_result.mean + 10.0


# ------------------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_mappo_improves_over_random_on_simple_spread():
    result = train_cooperative(SPREAD, MAPPOConfig(num_envs=16), total_steps=60_000, seed=0)
    assert result.steps == 60_000 and len(result.episode_returns) == 60_000 // 25
    trained = evaluate_policy(SPREAD, result.learners[0].policy(3), episodes=100, seed=5)
    random_result = evaluate_policy(SPREAD, RandomPolicy(), episodes=100, seed=5)
    assert trained.mean > random_result.mean + 3.0
