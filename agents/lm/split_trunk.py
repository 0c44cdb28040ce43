"""A trunk cut at a frozen layer: the layers below the lowest adapter read once, the layers above
read once per version of the adapters (the learner's KL reference and its policy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ludus.agents.lm.model import LMError, LMWithValueHead


def frozen_lower_layers(model: LMWithValueHead) -> int:
    """How many decoder layers at the bottom of `model`'s trunk hold nothing that trains (LoRA
    adapters in the top layers only: `LoRAConfig.layers`), for trunks built as Llama's (token
    embedding, `layers`, final `norm`, rotary position embedding: Llama, SmolLM2, Qwen2, Mistral);
    0 for any other trunk, or when the embedding trains. Those layers compute the same function
    whatever the adapters hold, switched on or off."""
    base = model.lm.base_model
    if not all(hasattr(base, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return 0
    if any(p.requires_grad for p in base.embed_tokens.parameters()):
        return 0
    for index, layer in enumerate(base.layers):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return len(base.layers)


class SplitTrunk:
    """`model`'s trunk cut below decoder layer `split`, to read the same inputs through several
    versions of the layers above it while the frozen layers below are read once.

    The learner reads each micro-batch twice, the KL reference with the adapters off and the
    policy with them on; with adapters in the top layers only, the two differ above `split` and
    nowhere else. `below()` is a model whose `trunk` runs the bottom layers and records what
    they hand up (the input of layer `split`); `above()` is a model whose `trunk` replays those
    records, in order, through the top layers and the final norm. Whoever drives them
    (`SharedPromptCache`) must make the same trunk calls, with the same masks and positions, on
    each: it does, since it is deterministic in its prompts. Each replay reads the records from
    the start; gradients reach the adapters above the split only (the records carry none).

    Every layer runs exactly as `LlamaModel.forward` runs it (rotary embedding of the positions,
    the 4-D masks passed through), so the readings equal the uncut model's to rounding: see
    tests/test_text_games.py."""

    def __init__(self, model: LMWithValueHead, split: int):
        if model.activation_tokens:
            raise LMError("a trunk cut at a frozen layer reads every token with the adapters; activated "
                          "adapters read the prompt without them (SharedPromptCache)")
        depth = len(model.lm.base_model.layers)
        if not 0 < split < depth:
            raise LMError(f"a trunk of {depth} layers is cut between layers 1 and {depth - 1}, not at {split}")
        self.model, self.split, self.depth = model, split, depth
        self.records: list[torch.Tensor] = []

    def _layers(self, hidden: torch.Tensor, start: int, stop: int, attention_mask: torch.Tensor | None,
                past_key_values: Any, position_ids: torch.Tensor | None, use_cache: bool) -> tuple[torch.Tensor, Any]:
        from transformers import DynamicCache
        from transformers.masking_utils import create_causal_mask

        base = self.model.lm.base_model
        if position_ids is None:
            raise LMError("a cut trunk needs explicit position ids")
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if attention_mask is None:
            # a plain causal read of a fresh sequence (SharedPromptCache's common prefix); the
            # layers above the split keep their keys in their own slots of the cache, so the
            # mask's size comes from the input, not from the cache's first layer
            if past_key_values is not None and past_key_values.get_seq_length(start) > 0:
                raise LMError("a cut trunk reads a cached sequence with an explicit mask only")
            attention_mask = create_causal_mask(config=base.config, inputs_embeds=hidden, attention_mask=None,
                                                past_key_values=None, position_ids=position_ids)
        position_embeddings = base.rotary_emb(hidden, position_ids=position_ids)
        for layer in base.layers[start:stop]:
            hidden = layer(hidden, attention_mask=attention_mask, position_embeddings=position_embeddings,
                           position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache)
        if stop == self.depth:
            hidden = base.norm(hidden)
        return hidden, (past_key_values if use_cache else None)

    def below(self) -> "_TrunkPart":
        """A model whose trunk reads token ids through the layers below the split (no gradients)
        and records their output; the records of an earlier reading are dropped."""
        self.records = []

        def trunk(input_ids, attention_mask=None, past_key_values=None, position_ids=None, use_cache=False):
            with torch.no_grad():
                hidden = self.model.lm.base_model.embed_tokens(input_ids)
                hidden, past = self._layers(hidden, 0, self.split, attention_mask, past_key_values, position_ids,
                                            use_cache)
            self.records.append(hidden)
            return hidden, past

        return _TrunkPart(trunk, self.model.heads)

    def above(self) -> "_TrunkPart":
        """A model whose trunk takes the next record (its token ids only name the call) through the
        layers above the split and the final norm."""
        records = iter(self.records)

        def trunk(input_ids, attention_mask=None, past_key_values=None, position_ids=None, use_cache=False):
            hidden = next(records, None)
            if hidden is None or tuple(hidden.shape[:2]) != tuple(input_ids.shape):
                raise LMError("the cut trunk is read above the split with other calls than below it")
            return self._layers(hidden, self.split, self.depth, attention_mask, past_key_values, position_ids,
                                use_cache)

        return _TrunkPart(trunk, self.model.heads)


@dataclass(frozen=True)
class _TrunkPart:
    """What `SharedPromptCache` and the learner's readings use of a model: its trunk and heads."""

    trunk: Callable[..., tuple[torch.Tensor, Any]]
    heads: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
