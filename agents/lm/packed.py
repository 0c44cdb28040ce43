"""Decode steps and prompt blocks on packed weights: the Llama-family forward without gradients.

A decode step multiplies a few dozen rows (one new token per game) by every weight matrix of the
model, and in between runs some twenty small operations per layer. Two costs dominate that are
not the arithmetic:

* `F.linear` hands each product to the BLAS, which lays the weight out for its micro-kernel again
  on every call. Reordering each weight once into oneDNN's blocked layout and calling oneDNN's
  inner product on it is what torch.compile's CPU backend does with frozen weights (its freezing
  pass emits `mkldnn._reorder_linear_weight` and `mkldnn._linear_pointwise`). On SmolLM2-135M's
  shapes at 32 rows, two threads of a 2-core AVX-512 EPYC: 120-124 GFLOP/s with `F.linear` in
  float32, 185-215 packed; the [32, 576] x [576, 49152] LM head 25 ms against 10.
* Hugging Face's layer calls q, k and v (and gate and up) one by one, and peft adds each adapter
  as two more products and a sum. Projections that read the same input are one product here (q,
  k and v stacked; gate and up stacked, as vLLM's `QKVParallelLinear` and `MergedColumnParallelLinear`
  stack them), and so are their adapters: the stacked A's rank-r outputs side by side, then one
  product by the block-diagonal of the B's, scaled, added in place.

The base is frozen, so its stacked weights are packed once per model and kept (`PackedBase`: a
copy of every linear layer, ~540 MB for SmolLM2-135M in float32). LoRA adapters change with every
update and with every member swapped into a shared base, so they are stacked again at each
`DecodeStep` (one per generation call: a few MB). Products are float32 rounded in another order
than the BLAS's (a logit's last bits, ~1e-6), so a learner's reading gives a played token's
log-prob back as closely as before (tests/test_packed_decode.py checks the step against the
model's own forward).

Generation only: `LMPolicy.generate` runs its decode steps and activated adapters' tokens here,
and `BaseReadings` reads the base's prompt blocks here, many at once (`read_blocks`: each block
the same floats as read alone). The packed op has no backward, so learners read through the
model's own forward (a differentiable packed product was tried for `text_exit`'s step of ~200
rows: no faster products, more small operations, slower). Models that are not of the Llama
family (`reads_blocks`, `DecodeStep.supports`), and hosts whose torch cannot pack
(`onednn_packing`), run the model's own forward.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from torch import nn

from ludus.agents.lm.kv_cache import shared_prefix_attention
from ludus.agents.lm.model import LMWithValueHead
from ludus.agents.nets import onednn_packing

PACK_ROWS = 32
"""Rows the packed layout is chosen for (a hint: every row count works; a decode step's rows)."""
DECODED_FAMILIES = ("llama",)
"""`config.model_type`s whose decoder layers `DecodeStep` runs (pre-norm, rotary, grouped-query
attention, SwiGLU, no biases): SmolLM2 and the Llama family."""


def packing_status(dtype: torch.dtype = torch.float32) -> str:
    """One line: how LM decoding runs on this host for a base of `dtype`."""
    name = str(dtype).removeprefix("torch.")
    if onednn_packing(dtype):
        return f"LM decoding ({name}): stacked projections on weights packed for oneDNN's inner product"
    return f"LM decoding ({name}): the model's own forward (this torch cannot pack {name} weights for oneDNN)"


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS)


def _linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


GROUPS = {"qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "o": ("self_attn", ("o_proj",)),
          "gate_up": ("mlp", ("gate_proj", "up_proj")), "down": ("mlp", ("down_proj",))}
"""A decoder layer's products, each the stack of the projections that read the same input."""


def _projections(layer: nn.Module) -> dict[str, list[nn.Module]]:
    """A decoder layer's projection modules (peft LoRA layers or linear layers) by `GROUPS` product."""
    return {group: [getattr(getattr(layer, part), name) for name in names] for group, (part, names) in GROUPS.items()}


def _base_linear(module: nn.Module) -> nn.Linear:
    """The frozen linear layer of a projection (a peft LoRA layer's `base_layer`, or the layer)."""
    return getattr(module, "base_layer", module)


def reads_blocks(model: LMWithValueHead) -> bool:
    """Whether this host packs the base's dtype and the model is of a family these steps run (no
    biases in its projections): then `read_blocks` reads its prompts and, adapters allowing
    (`DecodeStep.supports`), `DecodeStep` decodes."""
    config = model.lm.config
    if getattr(config, "model_type", "") not in DECODED_FAMILIES or getattr(config, "mlp_bias", False) \
            or getattr(config, "attention_bias", False):
        return False
    head = model.lm.get_output_embeddings()
    return head is not None and head.weight.device.type == "cpu" and onednn_packing(head.weight.dtype)


class PackedBase:
    """The packed stacked weights of a model's decoder layers (`GROUPS`) and its LM head; `stale`
    once a base weight is replaced or written (then it is packed again)."""

    def __init__(self, model: LMWithValueHead):
        stacks = [{group: [_base_linear(m).weight for m in modules] for group, modules in _projections(layer).items()}
                  for layer in model.lm.base_model.layers]
        head = model.lm.get_output_embeddings().weight
        self.weights = [w for stack in stacks for weights in stack.values() for w in weights] + [head]
        with torch.no_grad(), torch.inference_mode(False):
            self.layers = [{group: _pack(torch.cat(weights)) for group, weights in stack.items()} for stack in stacks]
            self.head = _pack(head)
        self.key = self._key()

    def _key(self) -> tuple:
        return tuple((w.data_ptr(), w._version, w.dtype) for w in self.weights)

    def stale(self) -> bool:
        return self._key() != self.key


_PACKED: "weakref.WeakKeyDictionary[LMWithValueHead, PackedBase]" = weakref.WeakKeyDictionary()
"""Each model's `PackedBase`, held beside the model rather than in it: packed tensors are opaque to
`copy.deepcopy` and pickle, which a model's copies (`frozen_copy`) go through; they go with the model."""


def packed_base(model: LMWithValueHead) -> PackedBase:
    """The model's `PackedBase`, packed on first use and again after its base weights changed."""
    held = _PACKED.get(model)
    if held is None or held.stale():
        _PACKED.pop(model, None)  # the old copy goes before the new one is made
        held = _PACKED[model] = PackedBase(model)
    return held


class _StackedAdapter:
    """The LoRA adapters of one stacked product: x A^T (the A's stacked, [n r, in]) times the
    block-diagonal of the scaled B's ([n r, out], zero where a projection has no adapter), added
    to the base's output."""

    def __init__(self, modules: list[nn.Module]):
        a, b = [], {}
        for i, module in enumerate(modules):
            adapter = _adapter_state(module)
            if adapter:
                a.append(module.lora_A[adapter].weight)
                b[i] = module.lora_B[adapter].weight * module.scaling[adapter]
        self.a = torch.cat(a)
        blocks = [b.get(i, self.a.new_zeros((_base_linear(m).out_features, 0))) for i, m in enumerate(modules)]
        self.b_t = torch.block_diag(*blocks).t().contiguous()

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        rows, flat = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
        if flat.dtype == self.a.dtype:
            flat.addmm_(rows @ self.a.t(), self.b_t)
        else:  # a bfloat16 base: the adapters in float32, the sum rounded once, as peft computes it
            flat.add_((rows.to(self.a.dtype) @ self.a.t()) @ self.b_t)
        return out


class DecodeStep:
    """The model's trunk and heads for a decode step, on `PackedBase` weights and the adapters
    as they are now (build one per generation call: adapters change between calls)."""

    def __init__(self, model: LMWithValueHead):
        self.model = model
        self.inner = model.lm.base_model
        self.base = packed_base(model)
        self.adapters: list[dict[str, _StackedAdapter | None]] = []
        for layer in self.inner.layers:
            self.adapters.append({group: _StackedAdapter(modules) if any(map(_adapter_state, modules)) else None
                                  for group, modules in _projections(layer).items()})
        config = model.lm.config
        self.heads_q = config.num_attention_heads
        self.heads_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    @staticmethod
    def supports(model: LMWithValueHead) -> bool:
        """Whether the model's base is one `reads_blocks` runs and its adapters (if any) are plain
        LoRA: one active adapter per layer, no dropout while training, no DoRA."""
        if not reads_blocks(model):
            return False
        # every projection a plain linear layer, or a LoRA layer whose adapter this step can run
        return all(_adapter_state(module) is not None for layer in model.lm.base_model.layers
                   for modules in _projections(layer).values() for module in modules)

    def heads(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [..., V] float32, values [...]) of hidden states, as `LMWithValueHead.heads`."""
        return _linear(hidden, self.base.head).float(), self.model.values(hidden)

    def trunk(self, tokens: torch.Tensor, attention_mask: torch.Tensor, past: Any, positions: torch.Tensor,
              shared_prefix: list[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor:
        """Last hidden states [E, K, H] of tokens [E, K] at `positions` after `past` (appended to
        it), as `LMWithValueHead.trunk` computes them with `attention_mask` [E, 1, K, columns]
        and the prefix that every row shares (agents/lm/kv_cache.py)."""
        inner = self.inner
        x = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(x, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [E, 1, K, head_dim]: every head
        rows, length = tokens.shape
        heads = self.heads_q + self.heads_kv
        q_width, kv_width = self.heads_q * self.head_dim, self.heads_kv * self.head_dim
        for index, (layer, packed, adapters) in enumerate(zip(inner.layers, self.base.layers, self.adapters)):
            attention = layer.self_attn
            qkv = _product(_rms_norm(layer.input_layernorm, x), packed["qkv"], adapters["qkv"])
            qk = _rotated(qkv[..., :q_width + kv_width].view(rows, length, heads, self.head_dim).transpose(1, 2),
                          cos, sin)
            q, k = qk[:, :self.heads_q], qk[:, self.heads_q:]
            v = qkv[..., q_width + kv_width:].view(rows, length, self.heads_kv, self.head_dim).transpose(1, 2)
            k, v = past.layers[index].update(k, v)
            out, _ = shared_prefix_attention(attention, q, k, v, attention_mask, scaling=attention.scaling,
                                             shared_prefix=shared_prefix)
            x = x + _product(out.reshape(rows, length, q_width), packed["o"], adapters["o"])
            x = _feed_forward(layer, packed, x, adapters)
        return _rms_norm(inner.norm, x)


def _product(x: torch.Tensor, packed: torch.Tensor, adapter: _StackedAdapter | None) -> torch.Tensor:
    out = _linear(x, packed)
    return out if adapter is None else adapter.add_to(out, x)


def _rotated(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of q and k stacked, in one pass (Su et al. 2021; as Hugging Face's
    apply_rotary_pos_emb)."""
    first, second = qk.chunk(2, dim=-1)
    return qk * cos + torch.cat((-second, first), dim=-1) * sin


def _feed_forward(layer: nn.Module, packed: dict[str, torch.Tensor], x: torch.Tensor,
                  adapters: dict[str, _StackedAdapter | None] | None = None) -> torch.Tensor:
    """`x` plus the layer's SwiGLU block on packed weights (gate and up one product), with the
    adapters of `adapters` where given."""
    adapters = adapters or {}
    gate, up = _product(_rms_norm(layer.post_attention_layernorm, x), packed["gate_up"],
                        adapters.get("gate_up")).chunk(2, dim=-1)
    return x + _product(layer.mlp.act_fn(gate).mul_(up), packed["down"], adapters.get("down"))


Block = tuple[tuple[int, ...], int, "list[tuple[torch.Tensor, torch.Tensor]] | None"]
"""A prompt block to read: its tokens, the position of its first, and per layer the keys and values
[1, kv heads, start, dim] of every token before it (None when it starts the prompt)."""


def read_blocks(model: LMWithValueHead, blocks: list[Block]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The base's keys and values [1, kv heads, len(tokens), dim] per layer of each block, many
    blocks at once and each the same floats as when read alone (`prompt_cache.BaseReadings` keeps
    them for a run on that promise; tests/test_packed_decode.py checks it).

    A block read alone through the model's own forward pays a cost per call whatever its length
    (SmolLM2-135M in float32 here: ~77 ms for 16 tokens, ~110 ms for 64; every weight matrix, 540
    MB, is read from memory per call). Here the products run over every block's rows together, on
    `PackedBase` weights: oneDNN's inner product computes a row from that row alone (its sums are
    not split with the row count, as the BLAS's are on two threads), so a row's floats do not
    depend on the rows beside it. One row alone is the exception (a matrix-vector kernel), so a
    lone row is read beside a copy of itself. The rest is per row (norms, rotary, SwiGLU), and
    attention runs per block over its own past, in the shapes it has alone. Adapters play no part:
    these are the base's readings. `reads_blocks` says which models this runs."""
    inner, base = model.lm.base_model, packed_base(model)
    config = model.lm.config
    heads_q, heads_kv = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads_q
    q_width, kv_width = heads_q * dim, heads_kv * dim
    lengths = [len(tokens) for tokens, _, _ in blocks]
    ids = torch.tensor([t for tokens, _, _ in blocks for t in tokens], dtype=torch.int64)
    positions = torch.cat([torch.arange(start, start + n) for (_, start, _), n in zip(blocks, lengths)])
    if len(ids) == 1:
        ids, positions = ids.repeat(2), positions.repeat(2)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    masks = [torch.ones(n, start + n, dtype=torch.bool).tril(start) for (_, start, _), n in zip(blocks, lengths)]
    read: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in blocks]
    with torch.no_grad(), torch.inference_mode(False):
        x = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(x[None], positions[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # [N, 1, head_dim]: every head
        last = len(inner.layers) - 1
        for index, (layer, packed) in enumerate(zip(inner.layers, base.layers)):
            attention = layer.self_attn
            qkv = _linear(_rms_norm(layer.input_layernorm, x), packed["qkv"])
            qk = _rotated(qkv[:, :q_width + kv_width].view(-1, heads_q + heads_kv, dim), cos, sin)
            v = qkv[:, q_width + kv_width:].view(-1, heads_kv, dim)
            outs = []
            for b, (_, start, before) in enumerate(blocks):
                rows = slice(bounds[b], bounds[b + 1])
                keys = qk[rows, heads_q:].transpose(0, 1)[None].contiguous()
                values = v[rows].transpose(0, 1)[None].contiguous()
                read[b].append((keys, values))
                if index == last:  # the last layer's keys and values are all that is kept of it
                    continue
                if before is not None:
                    keys = torch.cat([before[index][0], keys], dim=2)
                    values = torch.cat([before[index][1], values], dim=2)
                query = qk[rows, :heads_q].transpose(0, 1)[None]
                out = nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=masks[b],
                                                                 scale=attention.scaling, enable_gqa=True)
                outs.append(out[0].transpose(0, 1).reshape(-1, q_width))
            if index == last:
                break
            out = torch.cat(outs)
            if len(out) < len(x):  # the lone row's copy
                out = out.repeat(2, 1)
            x = _feed_forward(layer, packed, x + _linear(out, packed["o"]))
    return read


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Llama RMSNorm (Zhang and Sennrich 2019) in one fused op: normalised in float32, rounded to
    the input's dtype, then scaled, as `LlamaRMSNorm` computes it."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    normalised = nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
    return norm.weight * normalised.to(x.dtype)


def _adapter_state(module: nn.Module) -> str | None:
    """The name of the plain LoRA adapter `module` runs; "" where it runs none (a linear layer, or
    adapters off); None where it is anything this step cannot run."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer):
        return "" if isinstance(module, nn.Linear) and module.bias is None else None
    if module.base_layer.bias is not None:
        return None
    if module.disable_adapters:
        return ""
    active = [a for a in module.active_adapters if a in module.lora_A]
    if not active:
        return ""
    if len(active) > 1 or active[0] in getattr(module, "lora_variant", {}):
        return None
    dropout = module.lora_dropout[active[0]]
    return None if (not isinstance(dropout, nn.Identity) and dropout.training) else active[0]
