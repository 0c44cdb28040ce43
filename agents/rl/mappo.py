"""Multi-Agent PPO with a centralised critic (Yu et al. 2022, "The Surprising Effectiveness of
PPO in Cooperative Multi-Agent Games"), and IPPO as its ablation from the same code.

MAPPO is PPO with two choices that matter in cooperative games:

* one actor per team, shared by all the team's agents (parameter sharing), acting on
  each agent's local observation (optionally with the agent's id one-hot appended);
* a *centralised* critic V(s) on the global state during training (centralised training,
  decentralised execution): `Game.global_state()` (`VectorGame.global_states()`) when the game has one (`spec.state_shape`;
  PettingZoo Parallel envs give `env.state()`), else the concatenation of the observations of the
  agent's side (`ludus.agents.rollout.side_critic_inputs`, the same view league runners record). IPPO
  is the same algorithm with the critic on the agent's local observation (`critic_input="local"`,
  the paper's main comparison).

The paper's implementation details and MPE hyperparameters (its appendix) are the defaults of
`MAPPOConfig`: value normalisation (here the running mean/std "ValueNorm" of the authors' code,
not PopArt's output rescaling), Huber value loss (delta 10) with value clipping, layer norm on
the inputs, ReLU MLPs of 64 units with orthogonal init, Adam lr 7e-4 with eps 1e-5, gradient
clipping at 10, 10 epochs over one minibatch, entropy 0.01, advantages normalised over the batch.
The actor is feed-forward (the authors' MPE runs used a GRU; simple_spread is fully observed).

Agents that are out of the game (done while their team plays on) keep their rows in the
[T, B, P] rollout with `active = 0`; every loss is a mean weighted by `active`, so those rows
carry no gradient (the authors' `active_masks`).

`MAPPOLearner.update(batch) -> MAPPOStats` is a pure compute step (no environment access), one
per team. Outside a league, `ludus.agents.rl.mappo_rollout.collect_rollout` plays a
simultaneous-move `VectorGame` ([B, P] TimeStep layout) for T steps and builds one `MAPPOBatch`
per team, and `ludus.agents.rl.cooperative.train_cooperative` is the loop around them.

Reused from ludus.agents.rollout: `compute_gae` (mappo_rollout.py: one pass over the (slot, seat) columns of
the [T, B, P] rollout) and `side_critic_inputs` (the centralised view). Not reused: `SeatTrajectoryBuilder`,
whose flat rows of closed transitions carry one input per row (MAPPO needs the actor's and the
critic's) and drop seats that are not acting (MAPPO keeps them as masked rows). From
ludus.agents.ppo_core: the PPO loss (`ppo_terms`, weighted by the active-seat mask) and `TorchAdam` (Adam
+ gradient clipping with tensor-only state) for each of the actor and the critic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ludus.agents.nets import layer_init, masked_logits, mlp_trunk
from ludus.agents.policy import ActBatch, ActOutput
from ludus.agents.ppo_core import StatMeans, TorchAdam, categorical_entropy, ppo_terms, prefixed
from ludus.agents.rollout import side_critic_inputs, side_critic_size
from ludus.games.core import GameSpec

CRITIC_INPUTS = ("global", "local")


@dataclass(frozen=True)
class MAPPOConfig:
    """MAPPO hyperparameters; the defaults are the paper's for MPE (Yu et al. 2022, appendix)."""

    critic_input: str = "global"
    """'global': centralised critic on the global state (MAPPO); 'local': critic on the agent's
    own observation (IPPO, the paper's ablation)."""
    actor_learning_rate: float = 7e-4
    """Adam step size of the actor."""
    critic_learning_rate: float = 7e-4
    """Adam step size of the critic."""
    anneal_lr: bool = False
    """Decay both learning rates linearly to 0 over the run (the authors' `use_linear_lr_decay`,
    off for MPE); applied by the training loop through `MAPPOLearner.set_learning_rate_fraction`."""
    adam_eps: float = 1e-5
    """Adam epsilon (the authors' `opti_eps`)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation (Schulman et al. 2016)."""
    clip_coef: float = 0.2
    """epsilon of PPO's clipped surrogate objective, also the value-clipping range."""
    update_epochs: int = 10
    """Passes over the batch per update (the paper uses 10 or 15 on MPE)."""
    num_minibatches: int = 1
    """Minibatches per epoch (the paper: 1 on MPE, i.e. full-batch gradient steps)."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus in the actor's loss."""
    value_loss_coef: float = 1.0
    """Weight of the value loss in the critic's loss."""
    use_huber_loss: bool = True
    """Huber value loss instead of the squared error (robust to outlier returns)."""
    huber_delta: float = 10.0
    """Huber threshold, in normalised return units when `use_value_norm`."""
    clip_value_loss: bool = True
    """Clip the new value prediction to within `clip_coef` of the behaviour value (ppo2 style)."""
    use_value_norm: bool = True
    """The critic predicts returns normalised by running mean/std statistics (`ValueNorm`)."""
    value_norm_beta: float = 0.99999
    """Decay of ValueNorm's running moments (the authors' value: almost a plain running average)."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clipping threshold, applied to the actor and critic separately."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and critic MLPs (the authors' hidden_size 64, layer_N 1:
    an input layer and one more)."""
    feature_norm: bool = True
    """LayerNorm on the raw inputs of both nets (`use_feature_normalization`)."""
    hidden_layer_norm: bool = True
    """LayerNorm after each hidden ReLU, as the authors' MLPLayer does."""
    actor_agent_id: bool = False
    """Append the seat's one-hot id to the actor's input (lets a shared actor specialise)."""
    critic_agent_id: bool = True
    """Append the seat's one-hot id to the critic's input: the global state is the same for every
    agent, the id tells the critic whose (individual) reward it predicts."""
    critic_own_observation: bool = False
    """Centralised critic ('global') on the agent's own observation followed by the global state:
    the paper's agent-specific global state ("AS", Yu et al. 2022 §5.1), which beat the
    environment's global state alone (with or without the id) on most SMAC maps, because the
    features of the agent whose return is predicted come first instead of in its slot of the
    state."""
    num_envs: int = 128
    """Games stepped in parallel per rollout by the training loop (the paper's 128 rollout threads)."""
    num_steps: int = 25
    """Steps per game per rollout (the paper: episode_length 25, one MPE episode)."""

    def __post_init__(self) -> None:
        if self.critic_input not in CRITIC_INPUTS:
            raise ValueError(f"critic_input must be one of {CRITIC_INPUTS}, got {self.critic_input!r}")
        if self.update_epochs < 1 or self.num_minibatches < 1:
            raise ValueError("update_epochs and num_minibatches must be >= 1")
        if self.num_envs < 1 or self.num_steps < 1:
            raise ValueError("num_envs and num_steps must be >= 1")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))


# ---------------------------------------------------------------------------------------------
# Inputs of the actor and the critic.


def one_hot_seats(batch_shape: tuple[int, ...], num_players: int) -> np.ndarray:
    """[*batch_shape, P, P] float32: row p is seat p's one-hot id (the last batch axis is the seat)."""
    return np.broadcast_to(np.eye(num_players, dtype=np.float32), (*batch_shape, num_players, num_players))


def actor_inputs(obs: np.ndarray, config: MAPPOConfig) -> np.ndarray:
    """[B, P, D_actor] actor input per seat from observations [B, P, *obs_shape]: the seat's own
    observation, flattened, plus its one-hot id when `config.actor_agent_id`. Nothing of the
    other seats enters (decentralised execution)."""
    obs = np.asarray(obs, dtype=np.float32)
    return _with_ids(obs.reshape(obs.shape[0], obs.shape[1], -1), config.actor_agent_id)


def critic_inputs(obs: np.ndarray, global_state: np.ndarray | None, config: MAPPOConfig,
                  team_of_seat: tuple[int, ...]) -> np.ndarray:
    """[B, P, D_critic] critic input per seat, read as the league reads its runners' rows: the
    centralised view of `ludus.agents.rollout.side_critic_inputs` (the game's global state [B, S], or
    with None the concatenation of the seat's side's observations) turned into rows by
    `critic_rows` ('local', IPPO: the seat's own observation; the options add the own observation
    and the seat's one-hot id). obs: [B, P, *obs_shape] local observations.
    """
    obs = np.asarray(obs, dtype=np.float32)
    num_players = len(team_of_seat)
    if obs.ndim < 3 or obs.shape[1] != num_players:
        raise ValueError(f"critic_inputs needs observations shaped [B, P={num_players}, ...], got {obs.shape}")
    batch = obs.shape[0]
    central = side_critic_inputs(obs, global_state, team_of_seat) if config.critic_input == "global" else None
    rows = critic_rows(obs.reshape(batch * num_players, -1),
                       None if central is None else central.reshape(batch * num_players, -1),
                       np.tile(np.arange(num_players), batch), config, num_players)
    return rows.reshape(batch, num_players, -1)


def _with_ids(per_seat: np.ndarray, add_ids: bool) -> np.ndarray:
    """[B, P, D] -> [B, P, D (+P)] float32 with each seat's one-hot id appended if `add_ids`."""
    batch, num_players = per_seat.shape[0], per_seat.shape[1]
    flat = per_seat.reshape(batch, num_players, -1).astype(np.float32, copy=False)
    if not add_ids:
        return np.ascontiguousarray(flat)
    return np.concatenate([flat, one_hot_seats((batch,), num_players)], axis=-1)


def critic_rows(batch_obs: np.ndarray, critic_obs: np.ndarray | None, seats: np.ndarray, config: MAPPOConfig,
                num_players: int) -> np.ndarray:
    """[N, D] critic input of N rows: the recorded centralised input ('global'; after the row's own
    observation when `config.critic_own_observation`) or the row's own observation ('local',
    IPPO), with the seat's one-hot id when `config.critic_agent_id`."""
    if config.critic_input == "global":
        if critic_obs is None:
            raise ValueError("a centralised critic needs the rows' critic inputs (ActBatch/RolloutBatch.critic_obs)")
        x = np.asarray(critic_obs, dtype=np.float32).reshape(len(seats), -1)
        if config.critic_own_observation:
            x = np.concatenate([np.asarray(batch_obs, dtype=np.float32).reshape(len(seats), -1), x], axis=1)
    else:
        x = np.asarray(batch_obs, dtype=np.float32).reshape(len(seats), -1)
    if config.critic_agent_id:
        x = np.concatenate([x, np.eye(num_players, dtype=np.float32)[np.asarray(seats)]], axis=1)
    return np.ascontiguousarray(x)


def input_sizes(spec: GameSpec, config: MAPPOConfig) -> tuple[int, int]:
    """(actor input size, critic input size) for a game: the widths of `actor_inputs` and of
    `critic_inputs` / `critic_rows` rows."""
    obs_size = int(np.prod(spec.observation_shape))
    actor = obs_size + (spec.num_players if config.actor_agent_id else 0)
    if config.critic_input == "local":
        critic = obs_size
    else:
        critic = side_critic_size(spec) + (obs_size if config.critic_own_observation else 0)
    return actor, critic + (spec.num_players if config.critic_agent_id else 0)


# ---------------------------------------------------------------------------------------------
# Networks.


def _mlp(in_dim: int, config: MAPPOConfig) -> tuple[nn.Sequential, int]:
    """The authors' MLPBase: [LayerNorm(in)] then per layer Linear -> ReLU [-> LayerNorm]."""
    return mlp_trunk(in_dim, config.hidden, "relu", input_norm=config.feature_norm,
                     hidden_norm=config.hidden_layer_norm)


class MAPPOActor(nn.Module):
    """forward(x, mask) -> masked logits [N, A]; shared by all agents of a team."""

    def __init__(self, input_size: int, num_actions: int, config: MAPPOConfig):
        super().__init__()
        self.input_size = input_size
        self.trunk, dim = _mlp(input_size, config)
        # Gain 0.01 keeps the initial policy near uniform (the authors' ACTLayer).
        self.policy_head = layer_init(nn.Linear(dim, num_actions), std=0.01)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_logits(self.policy_head(self.trunk(x)), mask)


class MAPPOCritic(nn.Module):
    """forward(x) -> value [N], in normalised return units when the learner uses ValueNorm."""

    def __init__(self, input_size: int, config: MAPPOConfig):
        super().__init__()
        self.input_size = input_size
        self.trunk, dim = _mlp(input_size, config)
        self.value_head = layer_init(nn.Linear(dim, 1), std=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.trunk(x)).squeeze(-1)


class ValueNorm(nn.Module):
    """Running mean/std of value targets (the authors' ValueNorm; PopArt without the output rescaling).

    Keeps exponential moving averages of E[x] and E[x^2] with decay `beta`, debiased as in Adam
    (divided by 1 - beta^n, tracked as `debiasing_term`), so after the first update the
    statistics equal that batch's exactly. The variance is floored at 1e-2. The statistics are
    buffers: they travel with the critic's weights (a league's runners denormalise its values).
    """

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5):
        super().__init__()
        self.beta = beta
        self.epsilon = epsilon
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debiasing_term", torch.zeros((), dtype=torch.float64))

    def mean_var(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Debiased (mean, variance)."""
        scale = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / scale
        mean_sq = self.running_mean_sq / scale
        return mean, (mean_sq - mean ** 2).clamp(min=1e-2)

    def update(self, values: torch.Tensor) -> None:
        values = values.detach().double()
        self.running_mean = self.beta * self.running_mean + (1.0 - self.beta) * values.mean()
        self.running_mean_sq = self.beta * self.running_mean_sq + (1.0 - self.beta) * (values ** 2).mean()
        self.debiasing_term = self.beta * self.debiasing_term + (1.0 - self.beta)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return ((values.double() - mean) / var.sqrt()).to(values.dtype)

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return (values.double() * var.sqrt() + mean).to(values.dtype)


# ---------------------------------------------------------------------------------------------
# Acting.


def sample_masked(log_pi: np.ndarray, rng: np.random.Generator, greedy: bool) -> np.ndarray:
    """One action per row of [N, A] log-probabilities: argmax, or an inverse-CDF sample with one
    uniform per row drawn from `rng` (ludus.agents.torch_policy explains why illegal actions can't win)."""
    if greedy:
        return log_pi.argmax(axis=1).astype(np.int64)
    cdf = np.cumsum(np.exp(log_pi), axis=1)
    target = (1.0 - rng.random(len(cdf), dtype=np.float32)) * cdf[:, -1]
    return np.minimum((cdf < target[:, None]).sum(axis=1), log_pi.shape[1] - 1).astype(np.int64)


class SharedActorPolicy:
    """The team's shared actor as a `Policy` (decentralised execution: local observations only).

    Rows may mix seats; the seat's id is appended from `ActBatch.seats` when the actor was
    trained with `actor_agent_id`. `values` are 0: the critic needs the global state, which an
    `ActBatch` does not carry (the rollout collector evaluates the critic itself).
    """

    needs_history = False

    def __init__(self, actor: MAPPOActor, num_players: int, actor_agent_id: bool):
        self.actor = actor
        self.num_players = num_players
        self.actor_agent_id = actor_agent_id

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        rows = len(batch)
        x = np.asarray(batch.obs, dtype=np.float32).reshape(rows, -1)
        if self.actor_agent_id:
            x = np.concatenate([x, np.eye(self.num_players, dtype=np.float32)[np.asarray(batch.seats)]], axis=1)
        with torch.inference_mode():
            logits = self.actor(torch.from_numpy(np.ascontiguousarray(x)),
                                torch.from_numpy(np.asarray(batch.mask, dtype=bool)))
            log_pi = torch.log_softmax(logits, dim=-1).numpy()
        actions = sample_masked(log_pi, rng, greedy)
        if not np.asarray(batch.mask)[np.arange(rows), actions].all():
            raise FloatingPointError("the actor produced non-finite logits; an illegal action was chosen")
        return ActOutput(actions, log_pi[np.arange(rows), actions].astype(np.float32),
                         np.zeros(rows, dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# The learner.


@dataclass(frozen=True)
class MAPPOBatch:
    """One team's rollout as flat rows (one per step, slot and team seat), inactive rows included."""

    actor_obs: np.ndarray
    """[N, D_actor] float32 actor input (local observation [+ seat id])."""
    critic_obs: np.ndarray
    """[N, D_critic] float32 critic input (global state or local observation [+ seat id])."""
    mask: np.ndarray
    """[N, A] bool legal actions (all True on inactive rows, whose content is ignored)."""
    actions: np.ndarray
    """[N] int64 action taken."""
    logprobs: np.ndarray
    """[N] float32 behaviour log-probability of the action."""
    values: np.ndarray
    """[N] float32 behaviour critic's value estimate, in return units (denormalised)."""
    rewards: np.ndarray
    """[N] float32 reward the agent received in the step it acted (0 on inactive rows)."""
    advantages: np.ndarray
    """[N] float32 GAE advantages."""
    returns: np.ndarray
    """[N] float32 lambda-returns (advantages + values), the critic's targets."""
    active: np.ndarray
    """[N] float32 1 where the agent acted, 0 where it was out of the game: the loss weight."""
    seats: np.ndarray
    """[N] int64 seat of the row."""

    def __len__(self) -> int:
        return int(self.actions.shape[0])


@dataclass(frozen=True)
class MAPPOStats:
    """Averages over the minibatch steps of one `MAPPOLearner.update`."""

    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    """(r - 1) - log r, the low-variance KL estimator (Schulman's blog)."""
    clipfrac: float
    """Share of active rows whose ratio left [1 - clip, 1 + clip]."""
    actor_grad_norm: float
    critic_grad_norm: float
    explained_variance: float
    """1 - Var[returns - values] / Var[returns] over active rows (NaN if returns are constant)."""
    value_norm_mean: float
    """ValueNorm's mean after this update (0 without value normalisation)."""
    value_norm_std: float
    """ValueNorm's standard deviation after this update (1 without value normalisation)."""
    active_rows: int
    """Rows with non-zero loss weight."""
    minibatch_steps: int


class MAPPOLearner:
    """Owns one team's shared actor, its critic, their optimizers, ValueNorm and the minibatch RNG."""

    def __init__(self, actor: nn.Module, critic: MAPPOCritic, config: MAPPOConfig = MAPPOConfig(), seed: int = 0,
                 value_norm: ValueNorm | None = None):
        """`actor`: forward(x, mask) -> masked logits (`MAPPOActor`, or `ActorOfActorCritic` in a
        league). `value_norm`: the statistics to keep (a league shares the module's with its
        runners); a new one when None."""
        self.actor = actor
        self.critic = critic
        self.config = config
        self.actor_backend = TorchAdam(actor.parameters(), config.actor_learning_rate, config.adam_eps,
                                       config.max_grad_norm)
        self.critic_backend = TorchAdam(critic.parameters(), config.critic_learning_rate, config.adam_eps,
                                        config.max_grad_norm)
        self.value_norm = None
        if config.use_value_norm:
            self.value_norm = value_norm if value_norm is not None else ValueNorm(config.value_norm_beta)
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0

    @staticmethod
    def for_game(spec: GameSpec, config: MAPPOConfig = MAPPOConfig(), seed: int = 0) -> MAPPOLearner:
        """A learner with fresh nets sized for `spec`; initial weights follow from `seed`."""
        actor_size, critic_size = input_sizes(spec, config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # global RNG state untouched outside this block
            actor = MAPPOActor(actor_size, spec.num_actions, config)
            critic = MAPPOCritic(critic_size, config)
        return MAPPOLearner(actor, critic, config, seed)

    def set_learning_rate_fraction(self, fraction: float) -> None:
        """Scale both learning rates to `fraction` of the configured ones (linear annealing)."""
        self.actor_backend.set_learning_rate(fraction * self.config.actor_learning_rate)
        self.critic_backend.set_learning_rate(fraction * self.config.critic_learning_rate)

    def values(self, critic_obs: np.ndarray) -> np.ndarray:
        """The critic's value estimates of [N, D_critic] inputs, in return units."""
        with torch.inference_mode():
            raw = self.critic(torch.from_numpy(np.ascontiguousarray(critic_obs, dtype=np.float32)))
            if self.value_norm is not None:
                raw = self.value_norm.denormalize(raw)
        return raw.numpy().astype(np.float32)

    def update(self, batch: MAPPOBatch) -> MAPPOStats:
        config = self.config
        active = torch.from_numpy(np.asarray(batch.active, dtype=np.float32))
        active_rows = int((active > 0).sum())
        if active_rows == 0:
            raise ValueError("MAPPO update on a batch with no active row: collect some steps first")
        actor_obs = torch.from_numpy(batch.actor_obs)
        critic_obs = torch.from_numpy(batch.critic_obs)
        mask = torch.from_numpy(batch.mask)
        actions = torch.from_numpy(batch.actions)
        old_logprobs = torch.from_numpy(batch.logprobs)
        returns = torch.from_numpy(batch.returns)
        old_values = torch.from_numpy(batch.values)

        # Advantages normalised over the active rows of the whole batch (the authors' code).
        advantages = torch.from_numpy(batch.advantages)
        live = active > 0
        live_advantages = advantages[live]
        adv_std = live_advantages.std() if active_rows > 1 else torch.tensor(1.0)
        advantages = (advantages - live_advantages.mean()) / (adv_std + 1e-5)

        # The critic regresses on normalised targets; the statistics see this batch's returns first.
        # The clipping anchor is the behaviour value in the same (current) normalisation.
        if self.value_norm is not None:
            self.value_norm.update(returns[live])
            targets = self.value_norm.normalize(returns)
            anchors = self.value_norm.normalize(old_values)
        else:
            targets, anchors = returns, old_values

        means = StatMeans()
        value_clip = config.clip_coef if config.clip_value_loss else None
        huber_delta = config.huber_delta if config.use_huber_loss else None
        for _ in range(config.update_epochs):
            order = torch.randperm(len(batch), generator=self.generator)
            for rows in torch.tensor_split(order, min(config.num_minibatches, len(batch))):
                log_pi = torch.log_softmax(self.actor(actor_obs[rows], mask[rows]), dim=-1)
                new_logprob = log_pi.gather(1, actions[rows].unsqueeze(1)).squeeze(1)
                # One PPO loss, weighted by `active` (the authors' active_masks); the actor and the
                # critic are separate nets with separate optimizers, so each steps on its own term.
                terms = ppo_terms(new_logprob, old_logprobs[rows], advantages[rows], categorical_entropy(log_pi),
                                  self.critic(critic_obs[rows]), anchors[rows], targets[rows], config.clip_coef,
                                  value_clip, weights=active[rows], huber_delta=huber_delta)
                actor_grad_norm = self.actor_backend.step(terms.policy_loss - config.ent_coef * terms.entropy)
                critic_grad_norm = self.critic_backend.step(config.value_loss_coef * terms.value_loss)
                means.add({**terms.stats(), "actor_grad_norm": actor_grad_norm, "critic_grad_norm": critic_grad_norm})
        self.updates += 1

        m = means.means()
        live_np = np.asarray(batch.active) > 0
        var_returns = float(np.var(batch.returns[live_np]))
        explained = (float("nan") if var_returns == 0
                     else 1.0 - float(np.var(batch.returns[live_np] - batch.values[live_np])) / var_returns)
        if self.value_norm is not None:
            norm_mean, norm_var = self.value_norm.mean_var()
            norm_mean, norm_std = float(norm_mean), float(norm_var.sqrt())
        else:
            norm_mean, norm_std = 0.0, 1.0
        return MAPPOStats(policy_loss=m["policy_loss"], value_loss=m["value_loss"], entropy=m["entropy"],
                          approx_kl=m["approx_kl"], clipfrac=m["clipfrac"], actor_grad_norm=m["actor_grad_norm"],
                          critic_grad_norm=m["critic_grad_norm"], explained_variance=explained,
                          value_norm_mean=norm_mean, value_norm_std=norm_std, active_rows=active_rows,
                          minibatch_steps=means.count)

    def policy(self, num_players: int) -> SharedActorPolicy:
        """The actor as a `Policy` for `num_players`-seat games (follows the learner's updates)."""
        return SharedActorPolicy(self.actor, num_players, self.config.actor_agent_id)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything an exact resume needs, as named tensors (safetensors can store it)."""
        state = {f"actor.{k}": v.detach().clone() for k, v in self.actor.state_dict().items()}
        state.update({f"critic.{k}": v.detach().clone() for k, v in self.critic.state_dict().items()})
        state.update({f"actor_optimizer.{k}": v for k, v in self.actor_backend.state_dict().items()})
        state.update({f"critic_optimizer.{k}": v for k, v in self.critic_backend.state_dict().items()})
        if self.value_norm is not None:
            state.update({f"value_norm.{k}": v.detach().clone() for k, v in self.value_norm.state_dict().items()})
        state["generator"] = self.generator.get_state()
        state["updates"] = torch.tensor(self.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.actor.load_state_dict(prefixed(state, "actor."))
        self.critic.load_state_dict(prefixed(state, "critic."))
        self.actor_backend.load_state_dict(prefixed(state, "actor_optimizer."))
        self.critic_backend.load_state_dict(prefixed(state, "critic_optimizer."))
        if self.value_norm is not None:
            self.value_norm.load_state_dict(prefixed(state, "value_norm."))
        self.generator.set_state(state["generator"].clone())
        self.updates = int(state["updates"])


# ---------------------------------------------------------------------------------------------
# In a league: runners record each row's centralised critic input; a learner trains one side.


class ActorOfActorCritic(nn.Module):
    """A `ludus.agents.nets.ActorCritic` as MAPPO's actor: forward(x, mask) -> masked logits. A league's
    MAPPO side acts and freezes as an ordinary actor-critic net (snapshots, the arena, `ludus play`
    and evaluation read it unchanged); its own value head is not trained, the centralised critic
    replaces it."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net.policy_logits(x, mask)


class MAPPOModule(nn.Module):
    """What a league's runners receive from a MAPPO learner: the actor, the critic and the value
    statistics (runners record the critic's value of every row, in return units)."""

    def __init__(self, actor: nn.Module, critic: MAPPOCritic, value_norm: ValueNorm | None):
        super().__init__()
        self.actor = ActorOfActorCritic(actor)
        self.critic = critic
        self.value_norm = value_norm


class CentralisedCriticPolicy:
    """A league learner's side at play: the actor (an ActorCritic) chooses, the critic values.
    With a centralised critic (`needs_critic_input`) the runner hands it each row's recorded input."""

    needs_history = False

    def __init__(self, module: MAPPOModule, config: MAPPOConfig, num_players: int):
        from ludus.agents.torch_policy import TorchPolicy

        self.module = module
        self.config = config
        self.num_players = num_players
        self.needs_critic_input = config.critic_input == "global"
        self._actor = TorchPolicy(module.actor.net, compute_values=False)

    @property
    def dtype(self) -> torch.dtype:
        """What the actor acts in (`ludus.agents.torch_policy.TorchPolicy.dtype`); the critic's values stay float32."""
        return self._actor.dtype

    @dtype.setter
    def dtype(self, dtype: torch.dtype) -> None:
        self._actor.dtype = dtype

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        out = self._actor.act(batch, rng, greedy)
        x = critic_rows(batch.obs, batch.critic_obs, batch.seats, self.config, self.num_players)
        with torch.inference_mode():
            values = self.module.critic(torch.from_numpy(x))
            if self.module.value_norm is not None:
                values = self.module.value_norm.denormalize(values)
        return dataclasses.replace(out, values=values.numpy().astype(np.float32))
