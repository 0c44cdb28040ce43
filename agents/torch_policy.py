"""A `Policy` backed by an `ActorCritic` net: the hot path of self-play.

One call answers a batch of decision points (~1,000 rows in self-play) with one forward pass.
Sampling draws its randomness from the `np.random.Generator` the caller passes in, never from
torch's global RNG, so a match replays exactly from its seed. We sample by inverse CDF with one
uniform per row: the action is the first index whose cumulative probability reaches u * total,
u in (0, 1]. Illegal actions have probability exactly 0 (their logit is -1e9, agents.nets), so
the cumulative sum is flat there and they can never be the first index to reach a target > 0;
scaling by the row's own total keeps float32 rounding of the sum from running past the last
legal action. (Gumbel-max would be equally exact but draws A uniforms per row: 2x slower here.)

MLP nets act through a float32 numpy copy of their weights (`NumpyActor`): the same math, but
a self-play step asks ~17 policies for ~100-2,500 rows each, where torch's per-operation cost is
a large share; numpy's BLAS did the whole step 1.6x faster here (benchmarks/inference_paths.py,
which also measured stacked-weight bmm, torch.compile and bfloat16: none faster). Conv nets act
through torch.
"""

from __future__ import annotations

import numpy as np
import torch

from agents.nets import MASKED_LOGIT, ActorCritic
from agents.policy import ActBatch, ActOutput


class NumpyActor:
    """A float32 numpy copy of an MLP `ActorCritic` that computes masked logits and values."""

    def __init__(self, net: ActorCritic):
        def layers(trunk: torch.nn.Sequential) -> list[tuple[str, tuple[np.ndarray, ...]]]:
            out = []
            for layer in trunk:
                if isinstance(layer, torch.nn.Linear):  # stored [in, out] so that x @ W reads rows
                    out.append(("linear", (layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy())))
                elif isinstance(layer, torch.nn.LayerNorm):
                    out.append(("layer_norm", (layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy(),
                                               np.float32(layer.eps))))
                elif isinstance(layer, (torch.nn.ReLU, torch.nn.Tanh)):
                    out.append((type(layer).__name__.lower(), ()))
                else:
                    raise TypeError(f"NumpyActor cannot run a {type(layer).__name__} layer")
            return out

        self.obs_dim = net.obs_dim
        self.actor = layers(net.actor_trunk)
        self.critic = None if net.config.shared_trunk else layers(net.critic_trunk)
        self.policy_head = (net.policy_head.weight.detach().numpy().T.copy(), net.policy_head.bias.detach().numpy().copy())
        self.value_head = (net.value_head.weight.detach().numpy().T.copy(), net.value_head.bias.detach().numpy().copy())

    @staticmethod
    def _trunk(layers: list, x: np.ndarray) -> np.ndarray:
        for kind, params in layers:
            if kind == "linear":
                x = x @ params[0]
                x += params[1]
            elif kind == "relu":
                np.maximum(x, 0.0, out=x)
            elif kind == "tanh":
                np.tanh(x, out=x)
            else:  # layer_norm: biased variance, as torch
                mean = x.mean(axis=1, keepdims=True)
                var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
                x = (x - mean) / np.sqrt(var + params[2]) * params[0] + params[1]
        return x

    def __call__(self, obs: np.ndarray, mask: np.ndarray, values: bool) -> tuple[np.ndarray, np.ndarray]:
        """(masked logits [N, A], values [N], zeros unless `values`)."""
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), self.obs_dim)
        hidden = self._trunk(self.actor, x)
        logits = hidden @ self.policy_head[0]
        logits += self.policy_head[1]
        logits = np.where(mask, logits, np.float32(MASKED_LOGIT))
        if not values:
            return logits, np.zeros(len(obs), dtype=np.float32)
        value_hidden = hidden if self.critic is None else self._trunk(self.critic, x)
        return logits, (value_hidden @ self.value_head[0])[:, 0] + self.value_head[1][0]


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """Share memory with the numpy array when torch can; copy only read-only arrays.

    torch.from_numpy warns on read-only arrays (writes through the tensor would be undefined),
    so those, and only those, are copied.
    """
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


class TorchPolicy:
    """Acts with an `ActorCritic`: greedy = argmax of the masked logits, else a masked sample.

    The policy reads the net it was given (no copy): a learner's policy follows its updates, a
    snapshot's policy is frozen because the snapshot's net is.
    """

    needs_history = False

    def __init__(self, net: ActorCritic, compute_values: bool = True):
        self.net = net
        # Frozen opponents' values are never used: skipping the critic halves their inference.
        self.compute_values = compute_values
        self._numpy: tuple[tuple[int, ...], NumpyActor] | None = None

    def numpy_actor(self) -> NumpyActor | None:
        """The numpy copy of an MLP net (None for conv nets), remade when the net's weights change."""
        if self.net.config.kind != "mlp":
            return None
        # Every in-place write to a parameter (an optimizer step, load_state_dict) bumps its
        # version counter: the copy is remade exactly when the weights it copies have changed.
        versions = tuple(p._version for p in self.net.parameters())
        if self._numpy is None or self._numpy[0] != versions:
            self._numpy = (versions, NumpyActor(self.net))
        return self._numpy[1]

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        """Actions, their log-probabilities and the critic's values for every row of `batch`.

        `log_probs` are always log pi(action) under the net's masked softmax (also for greedy
        play, where they tell how confident the pick was).
        """
        mask_np = np.asarray(batch.mask, dtype=bool)
        actor = self.numpy_actor()
        if actor is not None:
            logits, values = actor(batch.obs, mask_np, self.compute_values)
            # log_softmax of the masked logits: exp(-1e9 - max) is exactly 0 in float32.
            shifted = logits - logits.max(axis=1, keepdims=True)
            exp = np.exp(shifted)
            total = exp.sum(axis=1, keepdims=True)
            log_pi = shifted - np.log(total)
            if greedy:
                actions = log_pi.argmax(axis=1)
            else:
                # Inverse CDF with one uniform per row from the caller's Generator.
                cdf = exp.cumsum(axis=1)
                targets = (1.0 - rng.random(len(cdf), dtype=np.float32)) * cdf[:, -1]
                actions = (cdf < targets[:, None]).sum(axis=1)
            return self._output(batch, actions, log_pi[np.arange(len(actions)), actions], values)
        obs = _as_tensor(batch.obs)
        mask = torch.from_numpy(mask_np)
        with torch.inference_mode():
            if self.compute_values:
                logits, values = self.net(obs, mask)
            else:
                logits, values = self.net.policy_logits(obs, mask), torch.zeros(obs.shape[0])
            # log_softmax of the masked logits: exp(-1e9 - max) is exactly 0 in float32, so this
            # is the log-softmax over the legal actions only.
            log_pi = torch.log_softmax(logits, dim=-1)
            if greedy:
                chosen = log_pi.argmax(dim=1)
            else:
                cdf = log_pi.exp().cumsum(dim=1)
                uniforms = torch.from_numpy(1.0 - rng.random(len(cdf), dtype=np.float32))
                chosen = (cdf < (uniforms * cdf[:, -1]).unsqueeze(1)).sum(dim=1)
            chosen_log_pi = log_pi.gather(1, chosen.unsqueeze(1)).squeeze(1)
        return self._output(batch, chosen.numpy(), chosen_log_pi.numpy(), values.numpy())

    @staticmethod
    def _output(batch: ActBatch, actions: np.ndarray, log_probs: np.ndarray, values: np.ndarray) -> ActOutput:
        if not batch.mask[np.arange(len(actions)), actions].all():
            # Only NaN logits can get here; a broken net is a bug, not a move.
            raise FloatingPointError("the net produced non-finite logits; an illegal action won the argmax")
        return ActOutput(
            actions=actions.astype(np.int64, copy=False),
            log_probs=log_probs.astype(np.float32, copy=False),
            values=values.astype(np.float32, copy=False),
        )
