"""KV caches for generation: columns appended in place, and a prefix that every row shares held once.

Hugging Face's `DynamicLayer` appends a decode step's keys and values with `torch.cat`, which
copies the whole layer every step: on SmolLM2-135M with 32 rows of ~260 columns that copying was
9% of a rollout's time under torch's profiler (benchmarks/llm_rollout.py). `ReservedLayer` keeps
the keys and values at the front of buffers with room for the columns still to come (a decode
step knows how many: at most one per row per new token), so an append writes only the new
columns, as the static caches of vLLM and Hugging Face's `StaticCache` do, while the layer still
exposes the exact [batch, heads, columns, dim] tensors that attention reads (views of the
buffers). For generation only (`torch.inference_mode`): a later append writes into the buffer
that earlier returned views share, which autograd would (rightly) refuse for tensors it saved.

`shared_prefix_attention` reads a prefix common to all rows (a game's rules) from one copy
instead of one per row (below).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` holding its columns in buffers with `reserve` spare columns; an append
    beyond the reserve doubles the buffers (so it stays correct, only slower)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, reserve: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._length = keys.shape[-2]
        self._keys = self._with_room(keys, self._length + reserve)
        self._values = self._with_room(values, self._length + reserve)
        self._expose()

    @staticmethod
    def _with_room(states: torch.Tensor, columns: int) -> torch.Tensor:
        batch, heads, length, dim = states.shape
        buffer = states.new_empty((batch, heads, columns, dim))
        buffer[:, :, :length] = states
        return buffer

    def _expose(self) -> None:
        self.keys = self._keys[:, :, :self._length]
        self.values = self._values[:, :, :self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            raise RuntimeError("ReservedLayer appends in place and serves generation only: read with "
                               "gradients through a DynamicCache")
        start, stop = self._length, self._length + key_states.shape[-2]
        if stop > self._keys.shape[2]:
            room = max(stop, 2 * self._keys.shape[2])
            self._keys = self._with_room(self.keys, room)
            self._values = self._with_room(self.values, room)
        self._keys[:, :, start:stop] = key_states
        self._values[:, :, start:stop] = value_states
        self._length = stop
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of columns to remove")
        self._length = max(0, self._length + tokens_to_remove)
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._keys = self._keys.repeat_interleave(repeats, dim=0)
        self._values = self._values.repeat_interleave(repeats, dim=0)
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._expose()


def reserve_columns(cache, columns: int) -> None:
    """Turn every layer of a filled `DynamicCache` into a `ReservedLayer` with room for `columns`
    more columns (one copy of the cache now, none per append later)."""
    cache.layers = [ReservedLayer(layer.keys, layer.values, columns) for layer in cache.layers]


# ------------------------------------------------- attention over a prefix that every row shares

SHARED_PREFIX_ATTENTION = "ludus_shared_prefix"
"""The name under which `shared_prefix_attention` is registered with transformers'
`AttentionInterface` (a model runs it while `attention_over_shared_prefix` is in force)."""


def shared_prefix_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, shared_prefix=None, **kwargs):
    """Attention of every row to one copy of the prefix all rows share plus its own columns.

    Cascade attention (FlashInfer's "cascade inference", Ye et al. 2024; Hydragen, Juravsky et al.
    2024): with a common prompt prefix (a game's rules), a batch's cache need not hold it once per
    row. The queries of all rows are stacked and read the prefix's keys and values in one matrix
    product; each row's own columns (`key`, `value`, under `attention_mask`) are read as usual; the
    two partial softmaxes are merged exactly (a shared running maximum, summed numerators and
    denominators). In a decode step this reads the prefix once instead of once per row.

    `shared_prefix[layer]` is (keys, values) [1, kv heads, P, dim]; every query sees all P columns
    (the prefix comes first in every row). Without it, this is transformers' SDPA attention.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout:
        raise ValueError("attention over a shared prefix serves generation only (no dropout)")
    prefix_keys, prefix_values = shared_prefix[module.layer_idx]
    rows, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads  # query heads per key/value head (grouped-query attention)
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, group * length, dim)  # query head h reads kv head h // group
    # the prefix: all rows' queries against its one copy, [1, kv, rows*group*length, P]
    stacked = q.transpose(0, 1).reshape(1, kv_heads, rows * group * length, dim)
    shared = torch.matmul(stacked, prefix_keys.transpose(-1, -2)).mul_(scale)
    shared = shared.view(kv_heads, rows, group * length, -1).transpose(0, 1)
    # each row's own columns, [rows, kv, group*length, own]
    own = torch.matmul(q, key.transpose(-1, -2)).mul_(scale)
    if attention_mask is not None:  # [rows, 1, length, own]: True where a query sees a column, or additive
        grouped = attention_mask.unsqueeze(2).expand(rows, 1, group, length, key.shape[2])
        grouped = grouped.reshape(rows, 1, group * length, key.shape[2])
        own = own.masked_fill(~grouped, float("-inf")) if grouped.dtype == torch.bool else own + grouped
    top = torch.maximum(shared.amax(dim=-1), own.amax(dim=-1)).unsqueeze(-1)
    shared = (shared - top).exp_()
    own = (own - top).exp_()
    total = shared.sum(dim=-1, keepdim=True) + own.sum(dim=-1, keepdim=True)
    from_prefix = torch.matmul(shared.transpose(0, 1).reshape(1, kv_heads, rows * group * length, -1), prefix_values)
    out = from_prefix.view(kv_heads, rows, group * length, dim).transpose(0, 1) + torch.matmul(own, value)
    out = (out / total).reshape(rows, heads, length, dim)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def attention_over_shared_prefix(model) -> Iterator[None]:
    """Within this context `model` (a transformers model) attends with `shared_prefix_attention`;
    its own attention implementation is restored on exit."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = SHARED_PREFIX_ATTENTION
    try:
        yield
    finally:
        model.config._attn_implementation = saved


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)


_register()
