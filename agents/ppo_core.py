"""The one PPO loss and the one optimizer seam, shared by PPO, MAPPO and token-level PPO.

`ppo_terms` computes, per Schulman et al. 2017 (arXiv 1707.06347):

* the clipped surrogate objective, eq. 7: L^CLIP = E[min(r A, clip(r, 1 - eps, 1 + eps) A)] with
  r = pi(a|s) / pi_behaviour(a|s) (the behaviour log-prob stored with each row, however stale);
* the value loss L^VF of eq. 9, optionally clipped around the behaviour value (baselines' ppo2,
  CleanRL, TRL) and optionally a Huber loss (the MAPPO paper, Yu et al. 2022);
* the entropy bonus S of eq. 9, and the diagnostics: approximate KL (Schulman's k3 estimator,
  E[(r - 1) - log r]), the old estimator E[-log r], the clipped fraction and the mean ratio.

Every term is a weighted mean over rows: PPO weighs all rows (`weights=None`, a plain mean),
MAPPO its active seats (an agent that has left carries weight 0), token PPO the tokens the player
wrote (the prompt and the opponent's tokens carry 0). A row with weight 0 contributes nothing and
no gradient, even if it holds garbage.

Updates go through an `UpdateBackend` (backward, gradient clipping, step): `TorchAdam` here, or
DeepSpeed's engine (agents/deepspeed_backend.py). Each backend owns its state as named tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import numpy as np
import torch
from torch import nn


def weighted_mean(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """sum(w x) / sum(w) over rows with w > 0; a plain mean when `weights` is None."""
    if weights is None:
        return x.mean()
    # torch.where, not x * w alone: a row of weight 0 may hold inf or NaN (padding), and 0 * inf is NaN.
    return torch.where(weights > 0, x * weights, torch.zeros_like(x)).sum() / weights.sum().clamp(min=1.0)


def huber(error: torch.Tensor, delta: float) -> torch.Tensor:
    """Elementwise Huber loss: error^2 / 2 inside |error| <= delta, linear outside."""
    abs_error = error.abs()
    quadratic = abs_error.clamp(max=delta)
    return 0.5 * quadratic ** 2 + delta * (abs_error - quadratic)


@dataclass(frozen=True)
class PPOTerms:
    """The loss terms of one minibatch (the first three carry gradients)."""

    policy_loss: torch.Tensor
    """-L^CLIP."""
    value_loss: torch.Tensor
    """L^VF (half squared error, or Huber)."""
    entropy: torch.Tensor
    """S, the mean entropy of the policy."""
    approx_kl: torch.Tensor
    old_approx_kl: torch.Tensor
    clipfrac: torch.Tensor
    """Share of rows whose ratio left [1 - eps, 1 + eps]."""
    ratio_mean: torch.Tensor

    def total(self, vf_coef: float, ent_coef: float) -> torch.Tensor:
        """Eq. 9 as a loss to minimise, for one net with both heads: -(L^CLIP - c1 L^VF + c2 S)."""
        return self.policy_loss - ent_coef * self.entropy + vf_coef * self.value_loss

    def stats(self) -> dict[str, float]:
        return {"policy_loss": self.policy_loss.item(), "value_loss": self.value_loss.item(),
                "entropy": self.entropy.item(), "approx_kl": self.approx_kl.item(),
                "old_approx_kl": self.old_approx_kl.item(), "clipfrac": self.clipfrac.item(),
                "ratio_mean": self.ratio_mean.item()}


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of a KL divergence, per sample ("Approximating KL divergence", 2020):
    with x = log q(s) - log p(s) on samples s ~ p, e^x - x - 1 (>= 0; its mean is unbiased for
    KL(p || q), with less variance than -x)."""
    return log_ratio.exp() - log_ratio - 1


def padded(rows: Iterable[np.ndarray], width: int) -> torch.Tensor:
    """[N, width] float32: ragged rows (e.g. each response's behaviour log-probs) left-aligned, zeros after."""
    rows = list(rows)
    out = torch.zeros((len(rows), width))
    for k, row in enumerate(rows):
        out[k, :len(row)] = torch.from_numpy(np.asarray(row, dtype=np.float32))
    return out


def ppo_terms(new_logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor, entropy: torch.Tensor,
              new_value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, clip_coef: float,
              value_clip: float | None, weights: torch.Tensor | None = None,
              huber_delta: float | None = None) -> PPOTerms:
    """PPO's loss terms over rows (any shape, all aligned), weighted by `weights` (None: all rows).

    `value_clip`: clip the new value to within that distance of the behaviour value (None: no
    clipping); `huber_delta`: Huber instead of half squared error."""
    log_ratio = new_logprob - old_logprob
    if weights is not None:
        log_ratio = torch.where(weights > 0, log_ratio, torch.zeros_like(log_ratio))
    ratio = log_ratio.exp()
    # Eq. 7 as a loss: the max of the negated surrogates is minus the min of the surrogates.
    surrogate = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef))
    policy_loss = weighted_mean(surrogate, weights)

    def value_error(prediction: torch.Tensor) -> torch.Tensor:
        error = prediction - returns
        return 0.5 * error ** 2 if huber_delta is None else huber(error, huber_delta)

    value_losses = value_error(new_value)
    if value_clip is not None:
        clipped = old_value + torch.clamp(new_value - old_value, -value_clip, value_clip)
        value_losses = torch.max(value_losses, value_error(clipped))
    value_loss = weighted_mean(value_losses, weights)
    entropy_mean = weighted_mean(entropy, weights)
    with torch.no_grad():
        approx_kl = weighted_mean(k3(log_ratio), weights)
        old_approx_kl = weighted_mean(-log_ratio, weights)
        clipfrac = weighted_mean(((ratio - 1.0).abs() > clip_coef).float(), weights)
        ratio_mean = weighted_mean(ratio.detach(), weights)
    return PPOTerms(policy_loss, value_loss, entropy_mean, approx_kl, old_approx_kl, clipfrac, ratio_mean)


def categorical_entropy(log_pi: torch.Tensor) -> torch.Tensor:
    """Entropy of each distribution over the last axis, from log-probabilities. Masked actions
    (log-prob -1e9 or -inf, probability exactly 0) contribute exactly 0."""
    probs = log_pi.exp()
    return -torch.where(probs > 0, probs * log_pi, torch.zeros_like(log_pi)).sum(-1)


class StatMeans:
    """Running means of named statistics (one value per minibatch)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)
        self.count += 1

    def means(self) -> dict[str, float]:
        return {name: total / max(self.count, 1) for name, total in self.sums.items()}


# --------------------------------------------------------------------------------- the seam


class UpdateBackend(Protocol):
    """How a loss becomes a parameter update: backward, gradient clipping, one optimizer step."""

    def step(self, loss: torch.Tensor) -> float:
        """Apply one update from `loss`; return the gradient norm before clipping."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Gradient accumulation: add `loss`'s gradients (one micro-batch of a minibatch)..."""
        ...

    def apply(self) -> float:
        """... and take the minibatch's step on them; returns the gradient norm before clipping."""
        ...

    def set_learning_rate(self, learning_rate: float) -> None: ...

    def learning_rate(self) -> float: ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The optimizer's state as named tensors only (safetensors can store it)."""
        ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class TorchAdam:
    """Adam on one parameter group (the trainable parameters), with global gradient-norm clipping
    (CleanRL's update step)."""

    def __init__(self, parameters: Iterable[nn.Parameter], learning_rate: float, adam_eps: float,
                 max_grad_norm: float, fused: bool = True):
        self.parameters = [p for p in parameters if p.requires_grad]
        # fused: one kernel for the whole Adam update instead of a handful of ops per parameter
        # tensor; same algorithm, ~25% less time per minibatch step for small nets on CPU (its
        # rounding differs from the unfused kernel in the last bits).
        self.optimizer = torch.optim.Adam(self.parameters, lr=learning_rate, eps=adam_eps, fused=fused)
        self.max_grad_norm = max_grad_norm

    def step(self, loss: torch.Tensor) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return self.apply()

    def backward(self, loss: torch.Tensor) -> None:
        """Add `loss`'s gradients to those of the minibatch so far (one micro-batch)."""
        loss.backward()

    def apply(self) -> float:
        """Clip and apply the gradients accumulated by `backward` calls since the last
        step (gradient accumulation: micro-batches that together are one minibatch); clears them."""
        grad_norm = nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def set_learning_rate(self, learning_rate: float) -> None:
        self.optimizer.param_groups[0]["lr"] = learning_rate

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return flat_optimizer_state(self.optimizer)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load_flat_optimizer_state(self.optimizer, state)


def flat_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """A one-group optimizer's state as named tensors: ``lr`` and ``state.<param>.<name>``.

    Per-parameter state (Adam: step, exp_avg, exp_avg_sq) is all tensors; of the group's
    hyperparameters only the (annealed) learning rate changes, the rest come from the config."""
    flat = {"lr": torch.tensor(float(optimizer.param_groups[0]["lr"]), dtype=torch.float64)}
    for index, param_state in optimizer.state_dict()["state"].items():
        for name, value in param_state.items():
            flat[f"state.{index}.{name}"] = torch.as_tensor(value).detach().clone()
    return flat


def load_flat_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, torch.Tensor]) -> None:
    """Restore `flat_optimizer_state` output. Every per-parameter tensor must have its parameter's
    shape (scalars such as Adam's step aside): torch's `load_state_dict` does not check, and a
    moment of another shape would fail only at the next step, far from the file that held it."""
    params = optimizer.param_groups[0]["params"]
    param_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if key.startswith("state."):
            _, digits, name = key.split(".", 2)
            index = int(digits)
            if not 0 <= index < len(params):
                raise ValueError(f"optimizer state {key!r} names parameter {index}; the optimizer has {len(params)}")
            if value.ndim > 0 and value.shape != params[index].shape:
                raise ValueError(f"optimizer state {key!r} has shape {tuple(value.shape)}, its parameter "
                                 f"{tuple(params[index].shape)}")
            param_state.setdefault(index, {})[name] = value.clone()
    template = optimizer.state_dict()
    template["param_groups"][0]["lr"] = float(state["lr"])
    optimizer.load_state_dict({"state": param_state, "param_groups": template["param_groups"]})


def prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of a flat state dict under `prefix`, with the prefix removed."""
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
