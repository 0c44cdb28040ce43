"""A `Policy` backed by an `ActorCritic` net: the hot path of self-play.

One call answers a batch of decision points (~1,000 rows in self-play) with one forward pass.
Sampling draws its randomness from the `np.random.Generator` the caller passes in, never from
torch's global RNG, so a match replays exactly from its seed. We sample by inverse CDF with one
uniform per row: the action is the first index whose cumulative probability reaches u * total,
u in (0, 1]. Illegal actions have probability exactly 0 (their logit is -1e9, agents.nets), so
the cumulative sum is flat there and they can never be the first index to reach a target > 0;
scaling by the row's own total keeps float32 rounding of the sum from running past the last
legal action. (Gumbel-max would be equally exact but draws A uniforms per row: 2x slower here.)

`dtype=torch.bfloat16` acts with a bfloat16 copy of the net (float32 logits). On this CPU (AVX512-
BF16) its matmuls are 1.7x faster at a fixed batch size, but a runner's batch sizes change every
step and bf16 kernels are built per shape: in `Runner.play` connect-four self-play gained 1.10x
(benchmarks/inference_paths.py, which also measured stacked-weight bmm, a numpy path and
torch.compile: none above 1.1x). The policy that plays is then the bf16 copy, and its log-probs
are what the learner's importance ratio divides by (the behaviour policy).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from agents.nets import ActorCritic
from agents.policy import ActBatch, ActOutput


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """Share memory with the numpy array when torch can; copy only read-only arrays.

    torch.from_numpy warns on read-only arrays (writes through the tensor would be undefined),
    so those, and only those, are copied.
    """
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


PAD_ROWS = 64
"""bf16 acting pads its batches to a multiple of this many rows (see `TorchPolicy.act`)."""


class TorchPolicy:
    """Acts with an `ActorCritic`: greedy = argmax of the masked logits, else a masked sample.

    The policy reads the net it was given (no copy): a learner's policy follows its updates, a
    snapshot's policy is frozen because the snapshot's net is.
    """

    needs_history = False

    def __init__(self, net: ActorCritic, compute_values: bool = True, dtype: torch.dtype = torch.float32):
        self.net = net
        # Frozen opponents' values are never used: skipping the critic halves their inference.
        self.compute_values = compute_values
        self.dtype = dtype
        """float32: act with `net` itself; bfloat16: with a bf16 copy, remade when net's weights change."""
        self._copy: tuple[tuple[int, ...], ActorCritic] | None = None

    def acting_net(self) -> ActorCritic:
        """The net that computes the actions: `net`, or its copy in `dtype`."""
        if self.dtype == torch.float32:
            return self.net
        # Every in-place write to a parameter (an optimizer step, load_state_dict) bumps its
        # version counter: the copy is remade exactly when the weights it copies have changed.
        versions = tuple(p._version for p in self.net.parameters())
        if self._copy is None or self._copy[0] != versions:
            self._copy = (versions, copy.deepcopy(self.net).to(self.dtype).eval())
        return self._copy[1]

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        """Actions, their log-probabilities and the critic's values for every row of `batch`.

        `log_probs` are always log pi(action) under the net's masked softmax (also for greedy
        play, where they tell how confident the pick was).
        """
        obs = _as_tensor(batch.obs)
        mask = _as_tensor(np.asarray(batch.mask, dtype=bool))
        net = self.acting_net()
        rows = len(obs)
        if self.dtype != torch.float32 and rows % PAD_ROWS:
            # oneDNN builds (JIT-compiles) a bf16 matmul for every new row count, which took
            # longer than the product itself at self-play's ever-changing batch sizes: padded
            # to a multiple of PAD_ROWS, the shapes repeat and the built kernels are reused.
            padded = -(-rows // PAD_ROWS) * PAD_ROWS
            obs = torch.cat([obs, obs.new_zeros((padded - rows, *obs.shape[1:]))])
            mask = torch.cat([mask, mask.new_ones((padded - rows, mask.shape[1]))])
        with torch.inference_mode():
            if self.compute_values:
                logits, values = net(obs, mask)
            else:
                logits, values = net.policy_logits(obs, mask), torch.zeros(obs.shape[0])
            logits, values = logits[:rows].float(), values[:rows].float()  # float(): a no-op in float32
            # log_softmax of the masked logits: exp(-1e9 - max) is exactly 0 in float32, so this
            # is the log-softmax over the legal actions only.
            log_pi = torch.log_softmax(logits, dim=-1)
            if greedy:
                chosen = log_pi.argmax(dim=1)
            else:
                # Inverse CDF with one uniform per row from the caller's Generator.
                cdf = log_pi.exp().cumsum(dim=1)
                uniforms = torch.from_numpy(1.0 - rng.random(len(cdf), dtype=np.float32))
                chosen = (cdf < (uniforms * cdf[:, -1]).unsqueeze(1)).sum(dim=1)
            chosen_log_pi = log_pi.gather(1, chosen.unsqueeze(1)).squeeze(1)
        actions = chosen.numpy()
        if not batch.mask[np.arange(len(actions)), actions].all():
            # Only NaN logits can get here; a broken net is a bug, not a move.
            raise FloatingPointError("the net produced non-finite logits; an illegal action won the argmax")
        return ActOutput(
            actions=actions.astype(np.int64, copy=False),
            log_probs=chosen_log_pi.numpy(),
            values=values.numpy().astype(np.float32, copy=False),
        )
