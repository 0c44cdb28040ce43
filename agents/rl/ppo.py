"""Proximal Policy Optimization (Schulman et al. 2017), shaped like CleanRL's ppo.py.

`PPOLearner.update(batch)` is a pure compute step over a `RolloutBatch`: epochs of shuffled
minibatches, the clipped surrogate objective (eq. 7), the combined loss with a value term and
an entropy bonus (eq. 9), advantage normalisation per minibatch and gradient clipping. The
probability ratio is taken against the behaviour log-probs stored with each transition, so
data collected by a policy a few versions behind the learner (asynchronous self-play) is
weighted correctly.

`train_single_player` is a small CleanRL-style training loop over a single-player game of the
registry (e.g. ``gym:CartPole-v1``): the same learner the league uses, fed by the same
`SeatTrajectoryBuilder`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import ActBatch
from ludus.agents.ppo_core import StatMeans, TorchAdam, UpdateBackend, categorical_entropy, ppo_terms, prefixed
from ludus.agents.rollout import RolloutBatch, SeatTrajectoryBuilder
from ludus.agents.torch_policy import TorchPolicy
from ludus.games.core import GameError
from ludus.games.registry import make_vector
from ludus.bounds import bounds


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters; the defaults are CleanRL's ppo.py (CartPole-v1)."""

    learning_rate: float = field(default=2.5e-4, metadata=bounds(0, 1, low_open=True))
    """Adam step size (the starting value when `anneal_lr`)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run; the training loop applies it through
    `PPOLearner.set_learning_rate` (the learner does not know the run's length)."""
    lr_decay_updates: float | None = field(default=None, metadata=bounds(0, None, low_open=True))
    """Instead of `anneal_lr`, for runs whose length is a time budget: learning rate
    lr / sqrt(1 + updates / lr_decay_updates), the step size under which online gradient descent's
    average regret vanishes (Zinkevich 2003), as the averaged self-play of league
    `output_policy: average` assumes in theory (on Leduc poker it changed the output's
    exploitability by less than the spread between seeds: docs/league.md). None: no such decay."""
    adam_eps: float = field(default=1e-5, metadata=bounds(0, 1, low_open=True))
    """Adam epsilon (CleanRL uses 1e-5, not torch's 1e-8)."""
    gamma: float = field(default=0.99, metadata=bounds(0, 1))
    """Discount factor."""
    gae_lambda: float = field(default=0.95, metadata=bounds(0, 1))
    """lambda of generalised advantage estimation (Schulman et al. 2016)."""
    num_minibatches: int = field(default=4, metadata=bounds(1, 10**6))
    """Minibatches per epoch: the batch is split into this many nearly equal parts."""
    minibatch_size: int | None = field(default=None, metadata=bounds(1, 10**7))
    """Fixed number of rows per minibatch instead (the last one may be smaller); None uses
    `num_minibatches`. Useful when batch sizes vary, as in turn-based self-play."""
    update_epochs: int = field(default=4, metadata=bounds(1, 1000))
    """Passes over the batch per update (K in the paper)."""
    norm_adv: bool = True
    """Normalise advantages to zero mean and unit std within each minibatch."""
    clip_coef: float = field(default=0.2, metadata=bounds(0, 1, low_open=True))
    """epsilon of the clipped surrogate objective (eq. 7), also the value-clipping range."""
    clip_vloss: bool = True
    """Clip the value prediction to within clip_coef of the behaviour value, as in the
    reference implementation (baselines' ppo2)."""
    ent_coef: float = field(default=0.01, metadata=bounds(0, 100))
    """c2 of eq. 9: weight of the entropy bonus (the starting value when `ent_decay_updates`)."""
    ent_decay_updates: float | None = field(default=None, metadata=bounds(0, None, low_open=True))
    """Decay the entropy bonus as ent_coef / sqrt(1 + updates / ent_decay_updates): the
    regularised game's equilibrium, which self-play's average approaches, moves towards the real
    one as the bonus fades (tried on Leduc poker: docs/league.md). None: a constant bonus."""
    vf_coef: float = field(default=0.5, metadata=bounds(0, 100))
    """c1 of eq. 9: weight of the value loss."""
    max_grad_norm: float = field(default=0.5, metadata=bounds(0, None, low_open=True))
    """Global gradient-norm clipping threshold."""
    target_kl: float | None = field(default=None, metadata=bounds(0, None, low_open=True))
    """Stop the epochs of an update early once the approximate KL of the last minibatch
    exceeds this; None never stops early."""
    matmul_dtype: Literal["float32", "bfloat16"] = "float32"
    """dtype of the net's forward (and so backward) matmuls: 'bfloat16' runs the forward under
    torch.autocast, with float32 weights, optimizer state and loss (mixed precision, Micikevicius
    et al. 2018). Here (AVX512-BF16) it made an update 1.4x faster: the update is matmul-bound."""

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.num_minibatches < 1:
            raise ValueError(f"num_minibatches must be >= 1, got {self.num_minibatches}")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1 or None, got {self.minibatch_size}")
        if self.update_epochs < 1:
            raise ValueError(f"update_epochs must be >= 1, got {self.update_epochs}")
        if self.matmul_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"matmul_dtype must be 'float32' or 'bfloat16', got {self.matmul_dtype!r}")
        for name in ("lr_decay_updates", "ent_decay_updates"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 or None, got {getattr(self, name)}")
        if self.anneal_lr and self.lr_decay_updates is not None:
            raise ValueError("anneal_lr and lr_decay_updates are two learning-rate schedules; set anneal_lr "
                             "false to decay by updates")

    def learning_rate_at(self, progress: float, updates: int) -> float:
        """The learning rate of the update after `updates` updates, `progress` (0 to 1) into the run."""
        if self.anneal_lr:
            return (1.0 - progress) * self.learning_rate  # CleanRL: linearly to 0 over the run
        if self.lr_decay_updates is not None:
            return self.learning_rate / math.sqrt(1.0 + updates / self.lr_decay_updates)
        return self.learning_rate

    def ent_coef_at(self, updates: int) -> float:
        """The entropy bonus of the update after `updates` updates."""
        if self.ent_decay_updates is None:
            return self.ent_coef
        return self.ent_coef / math.sqrt(1.0 + updates / self.ent_decay_updates)


@dataclass(frozen=True)
class PPOStats:
    """What one `PPOLearner.update` did; losses are means over its minibatch steps."""

    policy_loss: float
    """Clipped surrogate loss (negated objective of eq. 7)."""
    value_loss: float
    """0.5 * squared error of the value head (clipped if `clip_vloss`)."""
    entropy: float
    """Mean entropy of the masked policy."""
    old_approx_kl: float
    """KL(behaviour || current) estimate mean(-log r)."""
    approx_kl: float
    """Lower-variance estimate mean((r - 1) - log r) (http://joschu.net/blog/kl-approx.html)."""
    clipfrac: float
    """Fraction of rows whose ratio r lies outside [1 - clip_coef, 1 + clip_coef]."""
    ratio_mean: float
    """Mean probability ratio r = pi(a|s) / pi_behaviour(a|s)."""
    explained_variance: float
    """1 - Var(returns - values) / Var(returns) of the behaviour critic; NaN if returns are constant."""
    grad_norm: float
    """Mean gradient norm before clipping."""
    learning_rate: float
    """Learning rate used."""
    epochs: int
    """Epochs run (fewer than `update_epochs` when `target_kl` stopped early)."""
    minibatch_steps: int
    """Optimizer steps taken."""
    batch_size: int
    """Rows in the batch."""
    mean_policy_lag: float
    """Mean of (learner version - policy_version) over the batch: how stale the data was."""


@dataclass(frozen=True)
class DataShard:
    """This process's part of a data-parallel update: it holds rows `offset .. offset + len(batch)`
    of a global batch of `total` rows split over `world_size` ranks (DeepSpeed averages their
    gradients)."""

    rank: int
    world_size: int
    offset: int
    total: int


def _minibatches(indices: torch.Tensor, config: PPOConfig) -> tuple[torch.Tensor, ...]:
    if config.minibatch_size is not None:
        return torch.split(indices, config.minibatch_size)
    return torch.tensor_split(indices, min(config.num_minibatches, len(indices)))


def _minibatch_moments(x: torch.Tensor, rows: int, distributed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (unbiased) std of a minibatch's advantages; across every rank's rows when distributed."""
    if not distributed:
        return x.mean(), x.std()
    import torch.distributed as dist

    sums = torch.stack([x.sum(), (x * x).sum()]).double()
    dist.all_reduce(sums)
    mean = sums[0] / rows
    variance = (sums[1] - rows * mean * mean) / max(rows - 1, 1)
    return mean.to(x.dtype), variance.clamp(min=0.0).sqrt().to(x.dtype)


def _global_kl(approx_kl: torch.Tensor, rows: int, shard: DataShard | None) -> float:
    """The last minibatch's approximate KL (every rank's rows when distributed: all stop together)."""
    if shard is None:
        return float(approx_kl)
    import torch.distributed as dist

    weighted = torch.tensor([float(approx_kl) * rows, float(rows)], dtype=torch.float64)
    dist.all_reduce(weighted)
    return float(weighted[0] / max(weighted[1], 1.0))


class PPOLearner:
    """Owns the net being trained, its optimizer (through a backend) and the minibatch RNG."""

    def __init__(self, net: ActorCritic, config: PPOConfig = PPOConfig(), seed: int = 0,
                 backend: UpdateBackend | None = None):
        self.net = net
        self.config = config
        self.backend = backend if backend is not None else TorchAdam(
            net.parameters(), config.learning_rate, config.adam_eps, config.max_grad_norm)
        # Minibatch shuffling draws from this generator only; its state is part of state_dict.
        self.generator = torch.Generator().manual_seed(seed)
        # Number of `update` calls so far: the version of the learner's policy.
        self.updates = 0

    def set_learning_rate(self, learning_rate: float) -> None:
        self.backend.set_learning_rate(learning_rate)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.config.matmul_dtype == "float32":
            return contextlib.nullcontext()
        device = next(self.net.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16)

    def update(self, batch: RolloutBatch, shard: DataShard | None = None) -> PPOStats:
        """One PPO update on `batch`. With `shard`, this process holds one rank's rows of a global
        batch: every rank draws the same permutation of the global rows, takes its own rows of each
        global minibatch, normalises advantages with the minibatch's global mean and std, and
        scales its loss by (world size x its rows / the minibatch's rows), so the ranks' averaged
        gradient is the gradient of the whole minibatch's mean loss: N ranks with 1/N of the rows
        each take the update one process takes on all of them."""
        config = self.config
        b_obs = torch.from_numpy(batch.obs)
        b_mask = torch.from_numpy(batch.mask)
        b_actions = torch.from_numpy(batch.actions)
        b_logprobs = torch.from_numpy(batch.logprobs)
        b_advantages = torch.from_numpy(batch.advantages)
        b_returns = torch.from_numpy(batch.returns)
        b_values = torch.from_numpy(batch.values)
        batch_size = len(batch)
        if batch_size == 0:
            raise ValueError("PPO update on an empty batch: collect at least one closed transition first")
        mean_policy_lag = float(np.mean(self.updates - batch.policy_version))
        total = batch_size if shard is None else shard.total

        means = StatMeans()
        minibatch_steps, epochs = 0, 0
        value_clip = config.clip_coef if config.clip_vloss else None
        kl, kl_rows = torch.tensor(0.0), 0
        ent_coef = config.ent_coef_at(self.updates)
        for _ in range(config.update_epochs):
            epochs += 1
            b_inds = torch.randperm(total, generator=self.generator)
            for global_inds in _minibatches(b_inds, config):
                mb_inds, scale = global_inds, 1.0
                if shard is not None:
                    own = (global_inds >= shard.offset) & (global_inds < shard.offset + batch_size)
                    mb_inds = global_inds[own] - shard.offset
                    scale = shard.world_size * len(mb_inds) / len(global_inds)
                mb_advantages = b_advantages[mb_inds]
                if config.norm_adv and len(global_inds) > 1:
                    mean, std = _minibatch_moments(mb_advantages, len(global_inds), shard is not None)
                    mb_advantages = (mb_advantages - mean) / (std + 1e-8)
                if len(mb_inds) == 0:  # none of this minibatch's rows are here: a zero gradient
                    self.backend.step(sum(p.sum() * 0.0 for p in self.net.parameters()))
                    minibatch_steps += 1
                    kl_rows = 0
                    continue
                with self._autocast():
                    logits, newvalue = self.net(b_obs[mb_inds], b_mask[mb_inds])
                logits, newvalue = logits.float(), newvalue.float()  # no-ops unless autocast
                # Masked logits carry -1e9 on illegal actions: their probability is exactly 0, so
                # the log-prob and the entropy are over legal actions only.
                log_pi = torch.log_softmax(logits, dim=-1)
                newlogprob = log_pi.gather(1, b_actions[mb_inds].unsqueeze(1)).squeeze(1)
                # The ratio's denominator is the stored log-prob of the policy that acted, however
                # many versions ago; the value loss is clipped around the behaviour value (ppo2).
                terms = ppo_terms(newlogprob, b_logprobs[mb_inds], mb_advantages, categorical_entropy(log_pi),
                                  newvalue, b_values[mb_inds], b_returns[mb_inds], config.clip_coef, value_clip)
                grad_norm = self.backend.step(scale * terms.total(config.vf_coef, ent_coef))
                minibatch_steps += 1
                means.add({**terms.stats(), "grad_norm": grad_norm})
                kl, kl_rows = terms.approx_kl, len(mb_inds)

            if config.target_kl is not None and _global_kl(kl, kl_rows, shard) > config.target_kl:
                break

        self.updates += 1
        m = means.means()
        var_returns = float(np.var(batch.returns))
        explained_variance = (float("nan") if var_returns == 0
                              else 1.0 - float(np.var(batch.returns - batch.values)) / var_returns)
        return PPOStats(
            policy_loss=m["policy_loss"], value_loss=m["value_loss"], entropy=m["entropy"],
            old_approx_kl=m["old_approx_kl"], approx_kl=m["approx_kl"], clipfrac=m["clipfrac"],
            ratio_mean=m["ratio_mean"], explained_variance=explained_variance, grad_norm=m["grad_norm"],
            learning_rate=self.backend.learning_rate(), epochs=epochs, minibatch_steps=minibatch_steps,
            batch_size=batch_size, mean_policy_lag=mean_policy_lag)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything an exact resume needs, as named tensors: net, optimizer, shuffling RNG, update count."""
        state = {f"net.{name}": tensor.detach().clone() for name, tensor in self.net.state_dict().items()}
        state.update({f"optimizer.{name}": tensor for name, tensor in self.backend.state_dict().items()})
        state["generator"] = self.generator.get_state()
        state["updates"] = torch.tensor(self.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(prefixed(state, "net."))
        self.backend.load_state_dict(prefixed(state, "optimizer."))
        self.generator.set_state(state["generator"].clone())
        self.updates = int(state["updates"])


# ---------------------------------------------------------------------------------------------
# A training loop for single-player games, through the game layer.


@dataclass(frozen=True)
class TrainResult:
    """Outcome of `train_single_player`."""

    steps: int
    """Environment steps taken, summed over the parallel games."""
    seconds: float
    """Wall time from the start of the call to its end."""
    updates: int
    """PPO updates applied."""
    reached_target: bool
    """True when the mean of the last `return_window` episode returns reached `target_return`."""
    episode_returns: np.ndarray
    """[E] float32 return of every finished episode, in the order they ended."""
    episode_end_steps: np.ndarray
    """[E] int64 value of `steps` when each episode ended."""
    last_stats: PPOStats | None
    """Statistics of the last update (None if no update ran)."""
    net: ActorCritic
    """The trained net."""

    def mean_recent_return(self, window: int) -> float:
        """Mean return of the last `window` finished episodes (NaN before any)."""
        recent = self.episode_returns[-window:]
        return float(recent.mean()) if len(recent) else float("nan")


def train_single_player(game_id: str, config: PPOConfig = PPOConfig(), total_steps: int = 500_000, seed: int = 1,
                        num_envs: int = 4, num_steps: int = 128, net_config: NetConfig = NetConfig(hidden=(64, 64)),
                        target_return: float | None = None, return_window: int = 20,
                        policy_lag: int = 0) -> TrainResult:
    """CleanRL's PPO loop on `num_envs` copies of a single-player registry game.

    Runs `total_steps // (num_envs * num_steps)` rollout/update iterations, annealing the
    learning rate over all of them (as CleanRL), and stops early once the mean return of the
    last `return_window` finished episodes reaches `target_return`.

    policy_lag: the rollouts are collected by the learner's policy from that many updates ago
    (0 = on-policy), to exercise learning from stale data as asynchronous self-play produces it.
    The defaults (64x64 tanh actor and critic) are CleanRL's net.
    """
    start_time = time.perf_counter()
    games = make_vector(game_id, num_envs, seed)
    spec = games.spec
    if spec.num_players != 1:
        raise GameError(f"train_single_player needs a one-player game; {game_id!r} has {spec.num_players} seats")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the net's initial weights follow from `seed`, global RNG state untouched
        net = ActorCritic(spec, net_config)
    learner = PPOLearner(net, config, seed)
    # The acting net: the learner's own, or a copy that lags `policy_lag` versions behind it.
    behaviour_net = copy.deepcopy(net) if policy_lag > 0 else net
    # (version, weights) of the last policy_lag + 1 versions; the oldest one acts.
    recent_versions = deque([(0, copy.deepcopy(net.state_dict()))], maxlen=policy_lag + 1) if policy_lag > 0 else None
    behaviour_version = 0
    policy = TorchPolicy(behaviour_net)
    rng = np.random.default_rng(seed)
    builder = SeatTrajectoryBuilder(num_envs, 1, spec.observation_shape, spec.num_actions, spec.observation_dtype,
                                    capacity=num_envs * (num_steps + 1))
    record = np.ones((num_envs, 1), dtype=bool)
    seats = np.zeros(num_envs, dtype=np.int64)

    episode_returns: list[float] = []
    episode_end_steps: list[int] = []
    num_updates = total_steps // (num_envs * num_steps)
    global_step, stats, reached = 0, None, False
    ts = games.reset(games.seed_source(num_envs))
    for update in range(1, num_updates + 1):
        learner.set_learning_rate(config.learning_rate_at((update - 1.0) / num_updates, learner.updates))
        for _ in range(num_steps):
            out = policy.act(ActBatch(ts.obs[:, 0], ts.mask[:, 0], seats), rng)
            actions = out.actions[:, None]
            builder.record_actions(ts, actions, out.log_probs[:, None], out.values[:, None], record,
                                   behaviour_version)
            ts = games.step(actions)
            builder.record_outcome(ts)
            global_step += num_envs
            if ts.done.any():
                episode_returns.extend(ts.final_returns[ts.done, 0].tolist())
                episode_end_steps.extend([global_step] * int(ts.done.sum()))
                if (target_return is not None and len(episode_returns) >= return_window
                        and np.mean(episode_returns[-return_window:]) >= target_return):
                    reached = True
                    break
        if reached:
            break
        with torch.inference_mode():
            next_value = behaviour_net.value(torch.from_numpy(ts.obs[:, 0])).numpy()
        batch = builder.build(ts, next_value[:, None], config.gamma, config.gae_lambda)
        stats = learner.update(batch)
        if recent_versions is not None:
            recent_versions.append((learner.updates, copy.deepcopy(net.state_dict())))
            behaviour_version, behaviour_state = recent_versions[0]
            behaviour_net.load_state_dict(behaviour_state)
        else:
            behaviour_version = learner.updates

    return TrainResult(
        steps=global_step, seconds=time.perf_counter() - start_time, updates=learner.updates,
        reached_target=reached, episode_returns=np.asarray(episode_returns, dtype=np.float32),
        episode_end_steps=np.asarray(episode_end_steps, dtype=np.int64), last_stats=stats, net=net)
