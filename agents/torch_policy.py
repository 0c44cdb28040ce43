"""A `Policy` backed by an `ActorCritic` net: the hot path of self-play.

One call answers a batch of decision points (~1,000 rows in self-play) with one forward pass.
Sampling draws its randomness from the `np.random.Generator` the caller passes in, never from
torch's global RNG, so a match replays exactly from its seed. We sample by inverse CDF with one
uniform per row: the action is the first index whose cumulative probability reaches u * total,
u in (0, 1]. Illegal actions have probability exactly 0 (their logit is -1e9, ludus.agents.nets), so
the cumulative sum is flat there and they can never be the first index to reach a target > 0;
scaling by the row's own total keeps float32 rounding of the sum from running past the last
legal action. (Gumbel-max would be equally exact but draws A uniforms per row: 2x slower here.)

`dtype=torch.bfloat16` acts with a bfloat16 copy of the net (float32 logits), run with its
activations fused into oneDNN's products where it can (`ludus.agents.nets.FusedActing`). The policy that
plays is then the bf16 copy, and its log-probs are what the learner's importance ratio divides
by (the behaviour policy).

A runner asks ~17 policies per step. `TorchPolicy.act_together` answers a run of them in one
pass: each net computes its logits (frozen nets of one architecture as one
`ludus.agents.nets.StackedActors`, one grouped product per layer: bf16 nets always, float32 nets
where the float32 grouped kernel runs, `ludus.agents.kernels`), then one softmax and one sampling
pass over all rows, drawing from the Generator exactly as the policies' own `act` calls would in
turn. In connect-four self-play on this CPU (AMX bf16 tiles) that made `Runner.play` 1.18x faster
in float32 and 1.77x in bfloat16 than one `act` per policy in float32 (benchmarks/inference_paths.py;
bf16 acting alone had gained 1.10x: sixteen small bf16 products cost about as much as sixteen
float32 ones).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch

from ludus.agents.kernels import grouped_path
from ludus.agents.nets import ActorCritic, FusedActing, StackedActors
from ludus.agents.policy import ActBatch, ActOutput


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
        self._copy: tuple[list[int], ActorCritic, FusedActing | None] | None = None
        # nn.Module.parameters() walks the module tree (~0.1 ms, as long as a 100-row forward):
        # the parameters are listed once; load_state_dict and optimizers write into these same tensors.
        self._parameters = tuple(net.parameters())

    def acting_net(self) -> ActorCritic:
        """The net that computes the actions: `net`, or its copy in `dtype`."""
        return self._acting_copy()[0]

    def _acting_copy(self) -> tuple[ActorCritic, FusedActing | None]:
        """`net` itself in float32; else the bf16 copy, and its fused acting pass where oneDNN can
        run one (ludus.agents.nets.FusedActing)."""
        if self.dtype == torch.float32:
            return self.net, None
        # Every in-place write to a parameter (an optimizer step, load_state_dict) bumps its
        # version counter: the copy is remade exactly when the weights it copies have changed.
        versions = [p._version for p in self._parameters]
        if self._copy is None or self._copy[0] != versions:
            net = copy.deepcopy(self.net).to(self.dtype).eval()
            fused = FusedActing(net, self.compute_values) if FusedActing.can_fuse(net) else None
            self._copy = (versions, net, fused)
        return self._copy[1], self._copy[2]

    def __getstate__(self) -> dict:
        # The bf16 copy is a cache, and its fused weights are oneDNN's opaque tensors, which can be
        # neither copied nor pickled: a copied or unpickled policy makes its own when it first acts.
        return {**self.__dict__, "_copy": None}

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        """Actions, their log-probabilities and the critic's values for every row of `batch`.

        `log_probs` are always log pi(action) under the net's masked softmax (also for greedy
        play, where they tell how confident the pick was).
        """
        return TorchPolicy.act_together([(self, batch, greedy)], rng)[0]

    def masked_logits(self, batch: ActBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 masked logits [N, A] and values [N] (zeros without `compute_values`) of `batch`'s
        rows; called under `torch.inference_mode` (by `act_together`)."""
        obs = _as_tensor(batch.obs)
        mask = _as_tensor(np.asarray(batch.mask, dtype=bool))
        net, fused = self._acting_copy()
        rows = len(obs)
        if self.dtype != torch.float32 and rows % PAD_ROWS:
            # oneDNN builds (JIT-compiles) a bf16 matmul for every new row count, which took
            # longer than the product itself at self-play's ever-changing batch sizes: padded
            # to a multiple of PAD_ROWS, the shapes repeat and the built kernels are reused.
            padded = -(-rows // PAD_ROWS) * PAD_ROWS
            padded_obs = obs.new_zeros((padded, *obs.shape[1:]), dtype=self.dtype)  # converted as it is padded
            padded_obs[:rows] = obs
            obs = padded_obs
            mask = torch.cat([mask, mask.new_ones((padded - rows, mask.shape[1]))])
        if fused is not None:
            logits, values = fused(obs, mask)
            values = values if values is not None else torch.zeros(obs.shape[0])
        elif self.compute_values:
            logits, values = net(obs, mask)
        else:
            logits, values = net.policy_logits(obs, mask), torch.zeros(obs.shape[0])
        return logits[:rows].float(), values[:rows].float()  # float(): a no-op in float32

    @staticmethod
    def _logits_of(requests: Sequence[tuple["TorchPolicy", ActBatch, bool]]
                   ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each request's (masked logits, values or None for none); frozen nets of one architecture
        in one stack (bf16 nets always, float32 nets where the float32 grouped kernel runs)."""
        parts: list[tuple[torch.Tensor, torch.Tensor | None] | None] = [None] * len(requests)
        frozen = [i for i, (policy, _, _) in enumerate(requests)
                  if not policy.compute_values and (policy.dtype != torch.float32 or _stacks_float32())]
        # (one frozen net alone does not stack: its acting copy is fetched once, by masked_logits)
        found = None
        if len(frozen) >= 2:
            # A float32 policy acts with its own net, whose weights may change in place: the stack's
            # copy is checked against their versions (a bf16 copy is remade, a new net, instead).
            versions = [tuple(p._version for p in requests[i][0]._parameters)
                        if requests[i][0].dtype == torch.float32 else () for i in frozen]
            found = _stack_of([requests[i][0].acting_net() for i in frozen], versions)
        if found is not None:
            stack, positions = found
            request_at = dict(zip(positions, frozen))  # stack position -> request
            in_order = [request_at.get(g) for g in range(stack.num_nets)]  # None: a net with no rows now
            present = [i for i in in_order if i is not None]  # the requests in stack order
            obs = [_as_tensor(requests[i][1].obs) if i is not None else _NO_ROWS for i in in_order]
            mask = torch.from_numpy(np.concatenate([np.asarray(requests[i][1].mask, dtype=bool) for i in present]))
            logits = stack.policy_logits(obs, mask, PAD_ROWS)
            for i, piece in zip(present, torch.split(logits, [len(requests[i][1].obs) for i in present])):
                parts[i] = (piece, None)
        return [part or policy.masked_logits(batch) for part, (policy, batch, _) in zip(parts, requests)]

    @staticmethod
    def act_together(requests: Sequence[tuple["TorchPolicy", ActBatch, bool]],
                     rng: np.random.Generator) -> list[ActOutput]:
        """`policy.act(batch, rng, greedy)` for every (policy, batch, greedy) request, in one pass.

        Each net computes its own rows' logits; the softmax and the sampling then run once over all
        rows. What is drawn from `rng` is exactly what calling each policy's `act` in turn would
        draw (uniforms in request order, one per sampled row), and so is the result, but for frozen
        nets that compute as one stack, whose products may round differently in the last bit
        from one net's own. A runner stepping seventeen policies saves sixteen rounds of the small
        ops below (benchmarks/inference_paths.py).
        """
        with torch.inference_mode():
            parts = TorchPolicy._logits_of(requests)
            logits = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])
            # The softmax runs over dim 0 of the transposed logits [A, N]: with a handful of actions
            # and thousands of rows torch's kernels along the last dim are ~10x slower (~0.5 ms
            # for 4096 x 7 here). exp(-1e9 - max) is exactly 0 in float32, so these are the
            # (log-)probabilities over the legal actions only.
            logits_t = logits.T.contiguous()
            log_pi = torch.log_softmax(logits_t, dim=0)
            sizes = [len(batch) for _, batch, _ in requests]
            greedy = np.repeat([g for _, _, g in requests], sizes)
            if greedy.all():
                chosen = logits.argmax(dim=1)
            else:
                # Inverse CDF with one uniform per sampled row from the caller's Generator.
                cdf = torch.softmax(logits_t, dim=0).cumsum(dim=0)
                targets = torch.from_numpy(1.0 - rng.random(int((~greedy).sum()), dtype=np.float32))
                if greedy.any():
                    chosen = logits.argmax(dim=1)
                    sampled = torch.from_numpy(~greedy)
                    chosen[sampled] = (cdf[:, sampled] < targets * cdf[-1, sampled]).sum(dim=0)
                else:
                    chosen = (cdf < targets * cdf[-1]).sum(dim=0)
            chosen_log_pi = log_pi.gather(0, chosen.unsqueeze(0)).squeeze(0)
        actions = chosen.numpy().astype(np.int64, copy=False)
        mask = requests[0][1].mask if len(requests) == 1 else np.concatenate([batch.mask for _, batch, _ in requests])
        if not mask[np.arange(len(actions)), actions].all():
            # Only NaN logits can get here; a broken net is a bug, not a move.
            raise FloatingPointError("the net produced non-finite logits; an illegal action won the argmax")
        log_probs = chosen_log_pi.numpy()
        bounds = np.cumsum([0] + sizes)
        values = np.zeros(len(actions), dtype=np.float32)
        for (_, part_values), lo, hi in zip(parts, bounds[:-1], bounds[1:]):
            if part_values is not None:
                values[lo:hi] = part_values.numpy()
        return [ActOutput(actions=actions[lo:hi], log_probs=log_probs[lo:hi], values=values[lo:hi])
                for lo, hi in zip(bounds[:-1], bounds[1:])]


_STACKS: OrderedDict[tuple[int, ...], tuple[tuple[ActorCritic, ...], StackedActors | None,
                                            tuple[tuple[int, ...], ...]]] = OrderedDict()
"""The last few groups of nets seen, by their ids (held, so that the ids stay theirs): their stack,
or None where they cannot stack (`StackedActors.can_stack`), and the versions of each net's
parameters the stack copied (() for a net that never changes)."""

_NO_ROWS = torch.zeros(0)
"""The observations of a stacked net that has no rows this step."""


def _stacks_float32() -> bool:
    """Whether frozen float32 nets act as one stack: only on the grouped kernel (1.4x one product
    per net on the preset's 16 snapshots, measured; the float32 `baddbmm` stack was 0.5x)."""
    return grouped_path(torch.float32) is not None


def _stack_of(nets: Sequence[ActorCritic], versions: Sequence[tuple[int, ...]] | None = None
              ) -> tuple[StackedActors, list[int]] | None:
    """A stack that holds `nets` with their weights at `versions` (per net: its parameters'
    version counters, () for a net whose weights never change), and each net's position in it;
    None where they cannot stack.

    A cached stack of up to twice as many nets serves too (the nets not asked get no rows): as a
    task's last matches finish, the frozen nets that act change from step to step, and building
    a stack of sixteen 256-wide nets took ~1.2 ms, more than running it on the last few rows.
    """
    key = tuple(map(id, nets))
    versions = tuple(versions) if versions is not None else ((),) * len(key)
    if key not in _STACKS and len(set(key)) == len(key):
        for cached in reversed(_STACKS):
            _, stack, held = _STACKS[cached]
            if stack is not None and len(cached) <= 2 * len(key) and set(key) <= set(cached):
                position = {net: g for g, net in enumerate(cached)}
                if all(held[position[net]] == version for net, version in zip(key, versions)):
                    _STACKS.move_to_end(cached)
                    return stack, [position[net] for net in key]
    if key not in _STACKS or _STACKS[key][2] != versions:
        _STACKS[key] = (tuple(nets), StackedActors(nets) if StackedActors.can_stack(nets) else None, versions)
    _STACKS.move_to_end(key)
    if len(_STACKS) > 8:
        _STACKS.popitem(last=False)
    stack = _STACKS[key][1]
    return None if stack is None else (stack, list(range(len(key))))
