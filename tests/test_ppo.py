"""PPOLearner on tiny literal batches, and CartPole learning checks through the game layer."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.rl.ppo import PPOConfig, PPOLearner, train_single_player
from ludus.agents.ppo_core import TorchAdam, k3, padded
from ludus.agents.rollout import RolloutBatch
from ludus.games.core import GameSpec

SPEC = GameSpec(id="test:bandit", num_players=1, num_actions=3, observation_shape=(2,))


def make_net(seed: int = 0) -> ActorCritic:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ActorCritic(SPEC, NetConfig(hidden=(16,)))


def policy_probs(net: ActorCritic, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits, _ = net(torch.from_numpy(obs), torch.from_numpy(mask))
        return torch.softmax(logits, dim=-1).numpy()


def behaviour_logprobs(net: ActorCritic, obs: np.ndarray, mask: np.ndarray, actions: np.ndarray) -> np.ndarray:
    probs = policy_probs(net, obs, mask)
    return np.log(probs[np.arange(len(actions)), actions]).astype(np.float32)


def make_batch(net: ActorCritic, advantages, actions, logprob_shift: float = 0.0, mask=None) -> RolloutBatch:
    """Eight rows: observations alternate between two states; log-probs are the net's own plus a shift."""
    n = len(actions)
    obs = np.tile(np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), (n // 2, 1))
    mask = np.ones((n, 3), bool) if mask is None else np.asarray(mask, bool)
    actions = np.asarray(actions, np.int64)
    advantages = np.asarray(advantages, np.float32)
    values = np.full(n, 0.5, np.float32)
    return RolloutBatch(
        obs=obs, mask=mask, actions=actions,
        logprobs=behaviour_logprobs(net, obs, mask, actions) + np.float32(logprob_shift),
        values=values, rewards=advantages.copy(), dones=np.ones(n, bool), advantages=advantages,
        returns=advantages + values, policy_version=np.zeros(n, np.int64), slots=np.arange(n),
        seats=np.zeros(n, np.int64))


ACTIONS = [0, 1, 0, 1, 0, 1, 0, 1]
ADVANTAGES = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0]


def test_config_defaults_are_cleanrls():
    config = PPOConfig()
    assert (config.learning_rate, config.anneal_lr, config.gamma, config.gae_lambda) == (2.5e-4, True, 0.99, 0.95)
    assert (config.num_minibatches, config.update_epochs, config.norm_adv) == (4, 4, True)
    assert (config.clip_coef, config.clip_vloss, config.ent_coef, config.vf_coef) == (0.2, True, 0.01, 0.5)
    assert (config.max_grad_norm, config.target_kl, config.adam_eps) == (0.5, None, 1e-5)


def test_update_moves_the_policy_towards_positive_advantages():
    net = make_net()
    batch = make_batch(net, ADVANTAGES, ACTIONS)
    before = policy_probs(net, batch.obs[:2], batch.mask[:2])
    learner = PPOLearner(net, PPOConfig(learning_rate=1e-2, num_minibatches=2), seed=0)
    stats = learner.update(batch)
    after = policy_probs(net, batch.obs[:2], batch.mask[:2])
    assert np.all(after[:, 0] > before[:, 0])  # advantage +1
    assert np.all(after[:, 1] < before[:, 1])  # advantage -1
    assert stats.minibatch_steps == 8 and stats.epochs == 4 and stats.batch_size == 8
    assert learner.updates == 1


def test_bfloat16_matmuls_take_nearly_the_float32_update():
    """matmul_dtype bfloat16: the forward runs under autocast, the weights stay float32, and the
    update moves the policy as the float32 one does, to nearby weights (Adam's normalised steps
    turn bf16 rounding of tiny gradients into differences of a fraction of the step)."""
    updated = {}
    batch = make_batch(make_net(), ADVANTAGES, ACTIONS)
    before = policy_probs(make_net(), batch.obs[:2], batch.mask[:2])
    for dtype in ("float32", "bfloat16"):
        net = make_net()
        start = [p.detach().clone() for p in net.parameters()]
        stats = PPOLearner(net, PPOConfig(learning_rate=1e-2, num_minibatches=2, matmul_dtype=dtype),
                           seed=0).update(batch)
        assert all(p.dtype == torch.float32 for p in net.parameters())
        assert math.isfinite(stats.policy_loss) and math.isfinite(stats.value_loss)
        after = policy_probs(net, batch.obs[:2], batch.mask[:2])
        assert np.all(after[:, 0] > before[:, 0]) and np.all(after[:, 1] < before[:, 1])
        updated[dtype] = [p.detach() for p in net.parameters()]
    step = max(float((a - s).abs().max()) for a, s in zip(updated["float32"], start))
    gap = max(float((a - b).abs().max()) for a, b in zip(updated["float32"], updated["bfloat16"]))
    assert 0 < gap < 0.3 * step


def test_ratio_uses_the_stored_behaviour_logprobs():
    """Behaviour log-probs log(pi)/2-shifted: the ratio is pi / (pi/2) = 2 on every row, all clipped."""
    config = PPOConfig(num_minibatches=2)
    net = make_net()
    learner = PPOLearner(net, config, seed=0)
    learner.set_learning_rate(0.0)  # the policy stays put, so the ratio is exactly the batch's
    stats = learner.update(make_batch(net, ADVANTAGES, ACTIONS, logprob_shift=-math.log(2.0)))
    assert stats.ratio_mean == pytest.approx(2.0, rel=1e-5)
    assert stats.clipfrac == 1.0
    assert stats.approx_kl == pytest.approx(1.0 - math.log(2.0), rel=1e-4)
    assert stats.old_approx_kl == pytest.approx(-math.log(2.0), rel=1e-4)

    on_policy = learner.update(make_batch(net, ADVANTAGES, ACTIONS))
    assert on_policy.ratio_mean == pytest.approx(1.0, abs=1e-6)
    assert on_policy.clipfrac == 0.0


def test_clipped_rows_give_no_policy_gradient():
    """With positive advantages and ratio 2 > 1 + clip, min(rA, clip(r)A) is constant: no step at all."""
    config = PPOConfig(learning_rate=1e-2, norm_adv=False, ent_coef=0.0, vf_coef=0.0)
    positive = [1.0] * 8
    for shift, should_move in [(-math.log(2.0), False), (0.0, True)]:
        net = make_net()
        before = [p.detach().clone() for p in net.parameters()]
        PPOLearner(net, config, seed=0).update(make_batch(net, positive, ACTIONS, logprob_shift=shift))
        moved = any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
        assert moved == should_move


def test_target_kl_stops_the_epochs_early():
    net = make_net()
    learner = PPOLearner(net, PPOConfig(target_kl=0.01), seed=0)
    learner.set_learning_rate(0.0)
    stats = learner.update(make_batch(net, ADVANTAGES, ACTIONS, logprob_shift=-math.log(2.0)))
    assert stats.epochs == 1 and stats.minibatch_steps == 4


def test_entropy_and_logprobs_ignore_illegal_actions():
    net = make_net()
    mask = np.zeros((8, 3), bool)
    mask[:, 1] = True  # one legal action: entropy 0, log-prob 0
    batch = make_batch(net, ADVANTAGES, [1] * 8, mask=mask)
    np.testing.assert_allclose(batch.logprobs, 0.0, atol=1e-6)
    learner = PPOLearner(net, PPOConfig(), seed=0)
    learner.set_learning_rate(0.0)
    stats = learner.update(batch)
    assert stats.entropy == pytest.approx(0.0, abs=1e-6)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-6)
    assert all(math.isfinite(v) for v in (stats.policy_loss, stats.value_loss, stats.grad_norm))


def test_seeded_update_is_deterministic_and_the_seed_matters():
    def train(seed: int) -> list[torch.Tensor]:
        net = make_net()
        learner = PPOLearner(net, PPOConfig(learning_rate=1e-2), seed=seed)
        batch = make_batch(make_net(), ADVANTAGES, ACTIONS)
        learner.update(batch)
        learner.update(batch)
        return [p.detach().clone() for p in net.parameters()]

    first, again, other = train(seed=5), train(seed=5), train(seed=6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_decayed_entropy_bonus_is_the_constant_bonus_of_that_update():
    # after 3 updates, ent_coef 0.5 decaying with h = 1 weighs 0.5 / sqrt(1 + 3) = 0.25: the same
    # update as a learner with a constant 0.25, and not the one with the undecayed 0.5
    config = PPOConfig(learning_rate=1e-2, anneal_lr=False, ent_coef=0.5, ent_decay_updates=1.0)
    assert config.ent_coef_at(3) == 0.25 and config.ent_coef_at(0) == 0.5

    def after_update(config: PPOConfig) -> list[torch.Tensor]:
        net = make_net()
        learner = PPOLearner(net, config, seed=0)
        learner.updates = 3
        learner.update(make_batch(make_net(), ADVANTAGES, ACTIONS))
        return [p.detach().clone() for p in net.parameters()]

    decayed = after_update(config)
    constant = after_update(dataclasses.replace(config, ent_coef=0.25, ent_decay_updates=None))
    undecayed = after_update(dataclasses.replace(config, ent_decay_updates=None))
    assert all(torch.equal(a, b) for a, b in zip(decayed, constant))
    assert not all(torch.equal(a, b) for a, b in zip(decayed, undecayed))


def test_learning_rate_schedules():
    assert PPOConfig(learning_rate=1.0).learning_rate_at(0.25, 7) == 0.75  # anneal_lr: linear in progress
    by_updates = PPOConfig(learning_rate=1.0, anneal_lr=False, lr_decay_updates=2.0)
    assert [by_updates.learning_rate_at(0.9, u) for u in (0, 6)] == [1.0, 0.5]  # 1 / sqrt(1 + 6 / 2)
    assert PPOConfig(learning_rate=1.0, anneal_lr=False).learning_rate_at(0.9, 6) == 1.0
    with pytest.raises(ValueError, match="two learning-rate schedules"):
        PPOConfig(lr_decay_updates=2.0)
    with pytest.raises(ValueError, match="ent_decay_updates must be > 0"):
        PPOConfig(ent_decay_updates=0.0)


def test_league_learner_steps_with_the_scheduled_learning_rate():
    from ludus.league.learners.base import PPOLeagueLearner

    config = PPOConfig(learning_rate=1e-2, anneal_lr=False, lr_decay_updates=2.0)
    learner = PPOLeagueLearner(SPEC, NetConfig(hidden=(16,)), config, seed=0, init_seed=0)
    batch = make_batch(make_net(), ADVANTAGES, ACTIONS)
    for updates in range(3):  # each update's rate is the schedule's after the updates before it
        learner.update(batch, progress=0.5)
        assert learner.ppo.backend.learning_rate() == 1e-2 / math.sqrt(1.0 + updates / 2.0)


def test_state_dict_resumes_exactly_through_safetensors():
    from safetensors.torch import load, save

    config = PPOConfig(learning_rate=1e-2)
    net = make_net()
    learner = PPOLearner(net, config, seed=3)
    batch = make_batch(make_net(), ADVANTAGES, ACTIONS)
    learner.update(batch)
    learner.set_learning_rate(5e-3)
    saved = save(learner.state_dict())  # tensors only, so safetensors can hold it
    expected = learner.update(batch)

    resumed = PPOLearner(make_net(seed=99), config, seed=0)
    resumed.load_state_dict(load(saved))
    assert resumed.updates == 1
    stats = resumed.update(batch)
    assert stats == expected
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), resumed.net.parameters()))


def test_optimizer_state_of_another_shape_is_refused_when_loaded():
    # torch's Optimizer.load_state_dict takes moments of any shape; the wrong one would surface
    # only at the next step, so the flat loader checks each against its parameter.
    learner = PPOLearner(make_net(), PPOConfig(), seed=0)
    learner.update(make_batch(make_net(), ADVANTAGES, ACTIONS))
    state = learner.state_dict()
    name = next(k for k in state if k.startswith("optimizer.state.") and k.endswith(".exp_avg"))
    bad = dict(state, **{name: torch.zeros(*state[name].shape, 2)})
    with pytest.raises(ValueError, match=f"optimizer state '{name.removeprefix('optimizer.')}' has shape"):
        PPOLearner(make_net(), PPOConfig(), seed=0).load_state_dict(bad)
    index = max(int(k.split(".")[2]) for k in state if k.startswith("optimizer.state.")) + 1
    extra = dict(state, **{f"optimizer.state.{index}.exp_avg": torch.zeros(3)})
    with pytest.raises(ValueError, match=f"names parameter {index}; the optimizer has {index}"):
        PPOLearner(make_net(), PPOConfig(), seed=0).load_state_dict(extra)
    PPOLearner(make_net(), PPOConfig(), seed=0).load_state_dict(state)  # the saved state itself loads


def test_k3_averages_to_the_exact_kl_under_the_sampling_distribution():
    # E_p[e^x - x - 1] with x = log q - log p is sum q - 1 + KL(p || q) = KL(p || q), exactly
    rng = np.random.default_rng(0)
    for _ in range(5):
        p, q = (torch.from_numpy(rng.dirichlet(np.ones(6))).double() for _ in range(2))
        kl = float((p * (p.log() - q.log())).sum())
        assert float((p * k3(q.log() - p.log())).sum()) == pytest.approx(kl, rel=1e-9)
    assert float(k3(torch.zeros(3)).abs().max()) == 0.0
    assert bool((k3(torch.linspace(-5, 5, 101)) >= 0).all())


def test_padded_rows_are_left_aligned_with_zeros_after():
    rows = [np.array([-0.5, -1.0]), np.array([], dtype=np.float64), np.array([-2.0, -3.0, -4.0])]
    out = padded(rows, 4)
    assert out.dtype == torch.float32 and out.shape == (3, 4)
    assert out.tolist() == [[-0.5, -1.0, 0.0, 0.0], [0.0] * 4, [-2.0, -3.0, -4.0, 0.0]]


def test_backend_is_the_seam_for_the_optimizer_step():
    class CountingBackend(TorchAdam):
        steps = 0

        def step(self, loss: torch.Tensor) -> float:
            CountingBackend.steps += 1
            return super().step(loss)

    net = make_net()
    config = PPOConfig(minibatch_size=3, update_epochs=2)
    learner = PPOLearner(net, config, seed=0, backend=CountingBackend(net.parameters(), 1e-3, 1e-5, 0.5))
    stats = learner.update(make_batch(net, ADVANTAGES, ACTIONS))
    assert CountingBackend.steps == stats.minibatch_steps == 2 * 3  # 8 rows in minibatches of 3, 3, 2


def test_policy_lag_is_reported():
    net = make_net()
    learner = PPOLearner(net, PPOConfig(), seed=0)
    learner.updates = 5
    batch = dataclasses.replace(make_batch(net, ADVANTAGES, ACTIONS), policy_version=np.full(8, 3, np.int64))
    assert learner.update(batch).mean_policy_lag == 2.0


def test_train_single_player_runs_through_the_game_layer():
    torch.set_num_threads(1)
    result = train_single_player("gym:CartPole-v1", PPOConfig(), total_steps=2 * 4 * 64, seed=0, num_steps=64,
                                 policy_lag=1)
    assert result.steps == 512 and result.updates == 2 and not result.reached_target
    assert len(result.episode_returns) > 0 and np.all(result.episode_returns >= 1)
    assert np.all(np.diff(result.episode_end_steps) >= 0)
    assert result.last_stats.batch_size == 4 * 64
    assert result.last_stats.mean_policy_lag == 1.0


@pytest.mark.slow
def test_cartpole_reaches_475():
    torch.set_num_threads(1)
    result = train_single_player("gym:CartPole-v1", PPOConfig(), total_steps=500_000, seed=1, target_return=475.0)
    print(f"on-policy PPO: mean return {result.mean_recent_return(20):.1f} after {result.steps} steps, "
          f"{result.seconds:.1f} s")
    assert result.reached_target, f"mean return {result.mean_recent_return(20):.1f} after {result.steps} steps"


@pytest.mark.slow
def test_cartpole_reaches_475_with_data_two_versions_behind():
    torch.set_num_threads(1)
    result = train_single_player("gym:CartPole-v1", PPOConfig(), total_steps=500_000, seed=1, target_return=475.0,
                                 policy_lag=2)
    print(f"PPO with policy lag 2: mean return {result.mean_recent_return(20):.1f} after {result.steps} steps, "
          f"{result.seconds:.1f} s")
    assert result.last_stats.mean_policy_lag == 2.0
    assert result.reached_target, f"mean return {result.mean_recent_return(20):.1f} after {result.steps} steps"
