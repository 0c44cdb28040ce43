"""Token-level PPO for language-model policies in dialogue games (pure compute, no game loop).

A dialogue game is played one word token per action (games/dialogue.py). From one player's side a
finished game is a token sequence: context tokens, the partner's utterances (observations) and the
player's own tokens (actions). A causal LM reads the whole sequence in one pass, so the logits at
position t-1 are exactly the policy that chose token t.

The objective follows Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences",
eq. 2) as implemented in TRL and OpenRLHF, with the game score as the reward model:

* per-token reward on the player's own tokens: r_t = -beta * (log pi(a_t) - log pi_ref(a_t)), plus
  the final game score on the player's LAST own token. The KL penalty to a frozen reference model
  (the imitation model) keeps the language from drifting into degenerate strings (Lewis et al.
  2017, "Deal or No Deal?", §4: RL alone "diverges from human language");
* GAE (Schulman et al. 2016) with gamma=1, lambda=0.95 over the player's own tokens only. Partner
  tokens are not steps of this player's decision process: the next own token's value is the
  bootstrap, whatever the partner said in between (its words are part of that next state);
* the clipped surrogate objective and clipped value loss of PPO (Schulman et al. 2017, eq. 7;
  CleanRL's `ppo.py`), averaged over own tokens; partner tokens, context and padding carry zero
  weight in every loss;
* optionally one behaviour-cloning batch every k RL updates (Lewis et al. 2017 interleave
  supervised updates with RL for the same reason as the KL penalty), see `imitation_due`.

Sequences in a `TokenBatch` are right-padded; a causal model needs no attention mask for that
(real tokens never attend to later positions).

The loss is the one PPO loss of agents/ppo_core.py (`ppo_terms`, weighted by the own-token mask);
the optimizer step goes through its `UpdateBackend`, so a DeepSpeed engine (engine.backward(loss);
engine.step()) can replace the plain torch Adam step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ludus.agents.lm.model import LMWithValueHead, as_tensor, frozen_copy
from ludus.agents.nets import masked_logits
from ludus.agents.ppo_core import PPOTerms, StatMeans, TorchAdam, UpdateBackend, categorical_entropy, ppo_terms
from ludus.bounds import bounds


@dataclass(frozen=True)
class TokenPPOConfig:
    """Hyper-parameters of token-level PPO (defaults: docs/reference.md §4)."""

    lr: float = field(default=3e-4, metadata=bounds(0, 1, low_open=True))
    """Adam learning rate (1e-3 made the prototype's language collapse; 3e-4 was stable)."""
    adam_eps: float = field(default=1e-5, metadata=bounds(0, 1, low_open=True))
    """Adam epsilon (CleanRL's PPO value)."""
    clip: float = field(default=0.2, metadata=bounds(0, 1, low_open=True))
    """PPO ratio clipping epsilon."""
    value_clip: float | None = field(default=0.2, metadata=bounds(0, None, low_open=True))
    """Clip of the value prediction around the behaviour value (CleanRL/TRL); None = unclipped loss."""
    vf_coef: float = field(default=0.1, metadata=bounds(0, 100))
    """Weight of the value loss (TRL's 0.1: the value head shares the trunk with the policy)."""
    ent_coef: float = field(default=0.01, metadata=bounds(0, 100))
    """Weight of the entropy bonus (CleanRL's 0.01 for small models trained from scratch)."""
    gamma: float = field(default=1.0, metadata=bounds(0, 1))
    """Discount over own tokens (1: a dialogue is short and only its outcome matters)."""
    lam: float = field(default=0.95, metadata=bounds(0, 1))
    """GAE lambda over own tokens."""
    kl_beta: float = field(default=0.2, metadata=bounds(0, 100))
    """KL penalty coefficient (the initial one when adaptive); 0.2 kept the prototype stable, 0.05 drifted."""
    kl_target: float | None = field(default=None, metadata=bounds(0, None, low_open=True))
    """Target KL to the reference per sequence (nats); None = fixed beta, else Ziegler et al.'s
    adaptive controller moves beta towards it."""
    kl_horizon: int = field(default=10_000, metadata=bounds(1, 10**9))
    """Horizon of the adaptive controller in sequences (Ziegler et al. 2019 / TRL: 10,000)."""
    max_grad_norm: float = field(default=0.5, metadata=bounds(0, None, low_open=True))
    """Global gradient-norm clip."""
    epochs: int = field(default=4, metadata=bounds(1, 1000))
    """Passes over each batch."""
    minibatch_size: int = field(default=16, metadata=bounds(1, 10**6))
    """Sequences (rows) per minibatch."""
    normalize_advantages: bool = True
    """Whiten advantages over the batch's own tokens (TRL's `whiten`)."""
    advantages_per_role: bool = False
    """Whiten each role's (seat's) advantages separately, so that a role whose returns vary less
    is not drowned by the other in the shared policy's gradient (in the spirit of SPIRAL's
    role-conditioned advantage estimation, Liu et al. 2025, arXiv 2506.24119 §3.3). Needs
    `TokenBatch.roles`."""
    imitation_every: int = field(default=0, metadata=bounds(0, 10**6))
    """Interleave one imitation (behaviour-cloning) batch every k RL updates; 0 = off (the
    prototype used 4)."""
    imitation_coef: float = field(default=1.0, metadata=bounds(0, 100, low_open=True))
    """Weight of the cross-entropy loss of an imitation batch."""

    def __post_init__(self) -> None:
        positive = {"lr": self.lr, "adam_eps": self.adam_eps, "clip": self.clip, "max_grad_norm": self.max_grad_norm,
                    "epochs": self.epochs, "minibatch_size": self.minibatch_size, "kl_horizon": self.kl_horizon,
                    "imitation_coef": self.imitation_coef}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"TokenPPOConfig.{name} must be > 0, got {value}")
        for name in ("vf_coef", "ent_coef", "kl_beta", "imitation_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TokenPPOConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"TokenPPOConfig: gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"TokenPPOConfig.value_clip must be > 0 or None, got {self.value_clip}")
        if self.kl_target is not None and not self.kl_target > 0:
            raise ValueError(f"TokenPPOConfig.kl_target must be > 0 or None, got {self.kl_target}")


@dataclass(frozen=True)
class TokenBatch:
    """N token sequences from one player's side, right-padded to T; all arrays aligned by position.

    Position t holds token t; for own tokens, `log_probs`, `values` and `ref_log_probs` at t are
    those of the decision that emitted token t (the model's outputs at position t-1). Position 0
    can never be an own token (there is nothing to condition on).
    """

    input_ids: np.ndarray
    """[N, T] int64 tokens: context, both players' utterances, padding."""
    own_mask: np.ndarray
    """[N, T] bool: True where the learner emitted the token (its actions)."""
    log_probs: np.ndarray
    """[N, T] float32 behaviour log pi(token) at own tokens (anything elsewhere)."""
    values: np.ndarray
    """[N, T] float32 behaviour value of the state each own token was chosen in."""
    ref_log_probs: np.ndarray
    """[N, T] float32 log pi_ref(token) of the frozen reference at own tokens."""
    scores: np.ndarray
    """[N] float32 final game score of the player."""
    legal_mask: np.ndarray | None = None
    """[N, T, V] bool legal tokens at each position's decision (only own positions are read);
    None = the whole vocabulary was legal. Must be the mask the behaviour policy sampled under."""
    roles: np.ndarray | None = None
    """[N] int role (seat) the player had in each sequence (`advantages_per_role`)."""

    def __post_init__(self) -> None:
        n, t = np.shape(self.input_ids)
        if self.roles is not None and np.shape(self.roles) != (n,):
            raise ValueError(f"TokenBatch.roles has shape {np.shape(self.roles)}, expected {(n,)}")
        for name in ("own_mask", "log_probs", "values", "ref_log_probs"):
            if np.shape(getattr(self, name)) != (n, t):
                raise ValueError(f"TokenBatch.{name} has shape {np.shape(getattr(self, name))}, expected {(n, t)}")
        if np.shape(self.scores) != (n,):
            raise ValueError(f"TokenBatch.scores has shape {np.shape(self.scores)}, expected {(n,)}")
        if self.legal_mask is not None and np.shape(self.legal_mask)[:2] != (n, t):
            raise ValueError(f"TokenBatch.legal_mask has shape {np.shape(self.legal_mask)}, expected {(n, t)} + (V,)")
        if t and np.asarray(self.own_mask)[:, 0].any():
            raise ValueError("TokenBatch.own_mask[:, 0] must be False: the first token has no context to be chosen in")

    def __len__(self) -> int:
        return int(np.shape(self.input_ids)[0])

    @staticmethod
    def for_imitation(input_ids: np.ndarray, own_mask: np.ndarray, legal_mask: np.ndarray | None = None
                      ) -> "TokenBatch":
        """A batch for `imitation_update` (demonstrations: only tokens and the mask of the tokens to clone)."""
        zeros = np.zeros(np.shape(input_ids), np.float32)
        return TokenBatch(np.asarray(input_ids, np.int64), np.asarray(own_mask, bool), zeros, zeros, zeros,
                          np.zeros(np.shape(input_ids)[0], np.float32), legal_mask)


@dataclass(frozen=True)
class TokenPPOStats:
    """Diagnostics of one `update`, averaged over minibatches."""

    policy_loss: float
    value_loss: float
    entropy: float
    """Mean entropy of the (masked) next-token distribution at own tokens."""
    approx_kl: float
    """KL(behaviour || new) at own tokens, the (r-1) - log r estimator (Schulman 2020; CleanRL)."""
    clip_fraction: float
    """Fraction of own tokens whose ratio was clipped."""
    kl_to_reference: float
    """Mean over sequences of sum over own tokens of log pi - log pi_ref (behaviour policy)."""
    kl_beta: float
    """The KL coefficient used for this batch's rewards."""
    next_kl_beta: float
    """The coefficient after the adaptive controller's update (equal to kl_beta when fixed)."""
    mean_score: float
    explained_variance: float
    """1 - Var(returns - values) / Var(returns) over own tokens."""
    grad_norm: float
    """Mean pre-clip gradient norm."""
    own_tokens: int


@dataclass(frozen=True)
class ImitationStats:
    """Diagnostics of one `imitation_update`."""

    nll: float
    """Mean negative log-likelihood of the demonstrated own tokens, before the step."""
    accuracy: float
    """Fraction of own tokens that were the model's most likely (legal) token, before the step."""
    grad_norm: float
    own_tokens: int


# ------------------------------------------------------------------------- plain functions


def per_token_rewards(log_probs: np.ndarray, ref_log_probs: np.ndarray, own_mask: np.ndarray,
                      scores: np.ndarray, beta: float) -> np.ndarray:
    """[N, T] rewards: -beta * (log pi - log pi_ref) on own tokens, the score added on each row's
    last own token, 0 elsewhere (Ziegler et al. 2019, eq. 2, per token as in TRL)."""
    own = np.asarray(own_mask, bool)
    rewards = np.where(own, -beta * (np.asarray(log_probs, np.float64) - np.asarray(ref_log_probs, np.float64)), 0.0)
    has_own = own.any(axis=1)
    last = own.shape[1] - 1 - np.argmax(own[:, ::-1], axis=1)
    rows = np.flatnonzero(has_own)
    rewards[rows, last[rows]] += np.asarray(scores, np.float64)[rows]
    return rewards


def own_token_gae(rewards: np.ndarray, values: np.ndarray, own_mask: np.ndarray, gamma: float, lam: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """GAE over each row's own tokens only; returns (advantages, returns) [N, T], 0 off own tokens.

    With own tokens at positions t_1 < ... < t_K: delta_k = r_k + gamma * V_{k+1} - V_k (V_{K+1} = 0,
    the game is over) and A_k = delta_k + gamma * lam * A_{k+1} (Schulman et al. 2016, eq. 16).
    Partner tokens between t_k and t_{k+1} are skipped: they are part of the next own state.
    """
    own = np.asarray(own_mask, bool)
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    n, t_len = own.shape
    advantages = np.zeros((n, t_len))
    next_value = np.zeros(n)
    next_advantage = np.zeros(n)
    for t in reversed(range(t_len)):
        mask = own[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = np.where(mask, advantage, 0.0)
        next_value = np.where(mask, values[:, t], next_value)
        next_advantage = np.where(mask, advantage, next_advantage)
    returns = np.where(own, advantages + values, 0.0)
    return advantages, returns


def aligned_outputs(model: LMWithValueHead, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, T, V], values [N, T]) aligned with tokens: position t holds the model's
    outputs at t-1, i.e. the distribution token t was drawn from and the value of that state.
    Position 0 holds zeros (no decision)."""
    logits, values, _ = model(input_ids)
    logits = torch.cat([torch.zeros_like(logits[:, :1]), logits[:, :-1]], dim=1)
    values = torch.cat([torch.zeros_like(values[:, :1]), values[:, :-1]], dim=1)
    return logits, values


def _masked(logits: torch.Tensor, legal_mask: torch.Tensor | None) -> torch.Tensor:
    return logits if legal_mask is None else masked_logits(logits, legal_mask)


def token_log_probs(model: LMWithValueHead, input_ids: np.ndarray, legal_mask: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(log pi(token) [N, T], values [N, T]) of `model` at every position (0 at position 0): the
    behaviour or reference log-probs of a recorded sequence, under the same masks as sampling."""
    ids = as_tensor(input_ids, np.int64)
    with torch.inference_mode():
        logits, values = aligned_outputs(model, ids)
        mask = None if legal_mask is None else torch.from_numpy(_legal_with_tokens(legal_mask, input_ids))
        log_pi = torch.log_softmax(_masked(logits.float(), mask), dim=-1)
        chosen = log_pi.gather(-1, ids[..., None]).squeeze(-1)
        chosen[:, 0] = 0.0
    return chosen.numpy().astype(np.float32), values.numpy().astype(np.float32)


def _legal_with_tokens(legal_mask: np.ndarray, input_ids: np.ndarray) -> np.ndarray:
    """The legal mask with each position's actual token marked legal: off own positions the mask
    is not meaningful (partner tokens, padding), and a masked-out token there would only produce
    a -1e9 log-prob that every loss ignores anyway; this keeps all numbers finite and small."""
    legal = np.array(legal_mask, dtype=bool, copy=True)
    n, t = np.shape(input_ids)
    legal[np.arange(n)[:, None], np.arange(t)[None, :], np.asarray(input_ids)] = True
    return legal


def whitened(advantages: np.ndarray, own: np.ndarray, roles: np.ndarray | None = None) -> np.ndarray:
    """Advantages at own tokens shifted and scaled to mean 0, std 1 (TRL's `whiten`), over the
    whole batch or within each role's rows; 0 elsewhere."""
    groups = np.zeros(len(own), np.int64) if roles is None else np.asarray(roles)
    out = np.where(own, advantages, 0.0)
    for role in np.unique(groups):
        cells = own & (groups == role)[:, None]
        if cells.sum() > 1:
            a = advantages[cells]
            out = np.where(cells, (advantages - a.mean()) / (a.std() + 1e-8), out)
    return out


def token_ppo_loss(logits: torch.Tensor, values: torch.Tensor, tokens: torch.Tensor, own_mask: torch.Tensor,
                   old_log_probs: torch.Tensor, old_values: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, config: TokenPPOConfig,
                   legal_mask: torch.Tensor | None = None) -> PPOTerms:
    """PPO's loss terms averaged over own tokens; every other position has weight exactly 0.

    All inputs are aligned by token position ([n, T] or [n, T, V]): `logits[:, t]` is the
    distribution token t was drawn from (see `aligned_outputs`).
    """
    log_pi = torch.log_softmax(_masked(logits.float(), legal_mask), dim=-1)
    new_log_probs = log_pi.gather(-1, tokens[..., None]).squeeze(-1)
    return ppo_terms(new_log_probs, old_log_probs, advantages, categorical_entropy(log_pi), values, old_values,
                     returns, config.clip, config.value_clip, weights=own_mask.float())


# ---------------------------------------------------------------------------- KL control


class AdaptiveKLController:
    """Ziegler et al. 2019, §2.2: beta_{t+1} = beta_t * (1 + K * e_t), e_t = clip(KL/target - 1,
    -0.2, 0.2), K = n_sequences / horizon (TRL's `AdaptiveKLController`). target None = fixed beta."""

    def __init__(self, init_beta: float, target: float | None, horizon: int):
        self.value = float(init_beta)
        self.target = target
        self.horizon = horizon

    def update(self, kl: float, n_sequences: int) -> float:
        """Move beta after a batch of `n_sequences` whose mean KL to the reference was `kl`."""
        if self.target is not None:
            error = float(np.clip(kl / self.target - 1.0, -0.2, 0.2))
            self.value *= 1.0 + error * n_sequences / self.horizon
        return self.value


def token_adam(model: torch.nn.Module, config: TokenPPOConfig) -> TorchAdam:
    """The torch backend of token PPO: Adam over the trainable parameters. The unfused kernel,
    with which every negotiation figure in docs/reference.md was measured (the fused one rounds
    differently in the last bits, which a seeded run would amplify into different ledgers)."""
    return TorchAdam(model.parameters(), config.lr, config.adam_eps, config.max_grad_norm, fused=False)


# ------------------------------------------------------------------------------ the learner


def _sequence_width(own_mask: np.ndarray) -> int:
    """Columns a forward pass needs: up to the last own token of any row (the rest is padding or
    tokens after the player's last action, which no loss reads)."""
    own = np.asarray(own_mask, bool)
    if not own.any():
        return 0
    return int(own.shape[1] - np.argmax(own.any(axis=0)[::-1]))


class TokenPPOLearner:
    """Token-level PPO on an `LMWithValueHead`, with a frozen reference for the KL penalty.

    `update(batch)` and `imitation_update(batch)` are pure compute on recorded sequences. The
    model is kept in eval mode (dropout off) so that the ratio is exactly 1 at the first epoch,
    as TRL does. `ref_model`: the reference (e.g. the imitation model); None = a copy of `model`
    as it is now. Either way the learner keeps its own frozen deep copy.
    """

    def __init__(self, model: LMWithValueHead, ref_model: LMWithValueHead | None = None,
                 config: TokenPPOConfig = TokenPPOConfig(), seed: int = 0,
                 backend: UpdateBackend | None = None):
        self.model = model.eval()
        self.ref_model = frozen_copy(ref_model if ref_model is not None else model)
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.backend = backend if backend is not None else token_adam(model, config)
        self.kl_controller = AdaptiveKLController(config.kl_beta, config.kl_target, config.kl_horizon)
        self.rl_updates = 0
        self.rl_updates_since_imitation = 0

    @property
    def imitation_due(self) -> bool:
        """True when `imitation_every` RL updates have run since the last imitation batch."""
        every = self.config.imitation_every
        return every > 0 and self.rl_updates_since_imitation >= every

    def reference_log_probs(self, input_ids: np.ndarray, legal_mask: np.ndarray | None = None) -> np.ndarray:
        """[N, T] log pi_ref(token) of the frozen reference (to fill `TokenBatch.ref_log_probs`)."""
        return token_log_probs(self.ref_model, input_ids, legal_mask)[0]

    def update(self, batch: TokenBatch) -> TokenPPOStats:
        """`epochs` passes of clipped PPO over shuffled minibatches of rows."""
        cfg = self.config
        own = np.asarray(batch.own_mask, bool)
        beta = self.kl_controller.value
        rewards = per_token_rewards(batch.log_probs, batch.ref_log_probs, own, batch.scores, beta)
        advantages, returns = own_token_gae(rewards, batch.values, own, cfg.gamma, cfg.lam)
        if cfg.normalize_advantages:
            if cfg.advantages_per_role and batch.roles is None:
                raise ValueError("advantages_per_role needs TokenBatch.roles")
            advantages = whitened(advantages, own, batch.roles if cfg.advantages_per_role else None)
        kl = float(np.where(own, batch.log_probs - batch.ref_log_probs, 0.0).sum(axis=1).mean())

        width = _sequence_width(own)
        arrays = {
            "tokens": np.asarray(batch.input_ids, np.int64)[:, :width],
            "own_mask": own[:, :width],
            "old_log_probs": np.asarray(batch.log_probs, np.float32)[:, :width],
            "old_values": np.asarray(batch.values, np.float32)[:, :width],
            "advantages": advantages[:, :width].astype(np.float32),
            "returns": returns[:, :width].astype(np.float32),
        }
        tensors = {k: as_tensor(v, v.dtype) for k, v in arrays.items()}
        legal = (None if batch.legal_mask is None
                 else torch.from_numpy(_legal_with_tokens(np.asarray(batch.legal_mask)[:, :width], arrays["tokens"])))
        rows = np.flatnonzero(own.any(axis=1))
        means = StatMeans()
        for _ in range(cfg.epochs):
            order = rows[self.rng.permutation(len(rows))]
            for start in range(0, len(order), cfg.minibatch_size):
                index = torch.from_numpy(order[start: start + cfg.minibatch_size])
                mb = {k: v[index] for k, v in tensors.items()}
                logits, values = aligned_outputs(self.model, mb["tokens"])
                parts = token_ppo_loss(logits, values, mb["tokens"], mb["own_mask"], mb["old_log_probs"],
                                       mb["old_values"], mb["advantages"], mb["returns"], cfg,
                                       None if legal is None else legal[index])
                grad_norm = self.backend.step(parts.total(cfg.vf_coef, cfg.ent_coef))
                means.add({**parts.stats(), "grad_norm": grad_norm})
        m = means.means()
        old_values = np.asarray(batch.values, np.float64)[own]
        target = returns[own]
        variance = target.var() if target.size else 0.0
        explained = float(1.0 - (target - old_values).var() / variance) if variance > 0 else float("nan")
        next_beta = self.kl_controller.update(kl, len(batch))
        self.rl_updates += 1
        self.rl_updates_since_imitation += 1
        return TokenPPOStats(
            policy_loss=m.get("policy_loss", 0.0), value_loss=m.get("value_loss", 0.0), entropy=m.get("entropy", 0.0),
            approx_kl=m.get("approx_kl", 0.0), clip_fraction=m.get("clipfrac", 0.0), kl_to_reference=kl, kl_beta=beta,
            next_kl_beta=next_beta, mean_score=float(np.mean(batch.scores)) if len(batch) else 0.0,
            explained_variance=explained, grad_norm=m.get("grad_norm", 0.0), own_tokens=int(own.sum()))

    def imitation_update(self, batch: TokenBatch) -> ImitationStats:
        """One behaviour-cloning step: `imitation_coef` * cross-entropy of the own tokens (the
        demonstrator's tokens), masked like sampling. Also the warm start before RL."""
        own = np.asarray(batch.own_mask, bool)
        width = _sequence_width(own)
        if width == 0:
            raise ValueError("imitation batch has no own tokens to imitate")
        tokens = as_tensor(np.asarray(batch.input_ids)[:, :width], np.int64)
        own_t = as_tensor(own[:, :width], bool)
        legal = (None if batch.legal_mask is None
                 else torch.from_numpy(_legal_with_tokens(np.asarray(batch.legal_mask)[:, :width], tokens.numpy())))
        logits, _ = aligned_outputs(self.model, tokens)
        log_pi = torch.log_softmax(_masked(logits.float(), legal), dim=-1)
        nll_per_token = -log_pi.gather(-1, tokens[..., None]).squeeze(-1)
        nll = torch.where(own_t, nll_per_token, torch.zeros_like(nll_per_token)).sum() / own_t.sum()
        with torch.no_grad():
            accuracy = ((log_pi.argmax(-1) == tokens) & own_t).sum().item() / own_t.sum().item()
        grad_norm = self.backend.step(self.config.imitation_coef * nll)
        self.rl_updates_since_imitation = 0
        return ImitationStats(nll=float(nll.item()), accuracy=float(accuracy), grad_norm=grad_norm,
                              own_tokens=int(own.sum()))
