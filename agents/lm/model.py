"""The language model: a causal LM with a value head, and its snapshot files.

In a dialogue game one action is one word token (games/dialogue.py), so a causal language model
is a policy: its next-token distribution over the vocabulary, masked to the legal tokens, is
pi(a | observation). A scalar value head on the trunk's last hidden state gives the critic that
token-level PPO needs (agents/rl/token_ppo.py; Ziegler et al. 2019, "Fine-Tuning Language Models from
Human Preferences", put the value head on the same trunk).

Two kinds of model come in through the same wrapper, `LMWithValueHead`:

* a tiny GPT-2 built from `TinyLMConfig` (~113k parameters at the defaults, pure CPU), the model
  that learns negotiation from scratch (docs/reference.md §4);
* any Hugging Face causal LM saved in a LOCAL directory (`load_hf_causal_lm`), e.g. SmolLM2-135M
  from a GGUF file, loaded with ``local_files_only=True`` and HF_HUB_OFFLINE=1: never the hub.

Acting and generating with it is `ludus.agents.lm.generation`; the keys and values of prompts
read once and shared are `ludus.agents.lm.prompt_cache`; a trunk cut at a frozen layer is
`ludus.agents.lm.split_trunk`.

Snapshots store the model as JSON (the Hugging Face config) plus safetensors (the state dict) and,
for pretrained models, the tokenizer's JSON/text files: never pickle (`lm_state_for_snapshot`,
`lm_from_snapshot_files`). agents/snapshot.py writes them as kind "lm".
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from ludus.agents.nets import layer_init, shape_mismatch
from ludus.bounds import bounds
from ludus.errors import UserError


class LMError(UserError, ValueError):
    """A language model that cannot be loaded or rebuilt; the message says what to do."""


# ------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class TinyLMConfig:
    """A small GPT-2 (Radford et al. 2019) for token games; stored in snapshots to rebuild it."""

    vocab_size: int = field(default=75, metadata=bounds(1, 10**6))
    """Number of tokens (the dialogue game's vocabulary size)."""
    n_positions: int = field(default=128, metadata=bounds(1, 65536))
    """Longest token sequence the model can read (learned position embeddings)."""
    n_embd: int = field(default=64, metadata=bounds(1, 65536))
    """Width of the residual stream."""
    n_layer: int = field(default=2, metadata=bounds(1, 1024))
    """Number of transformer blocks."""
    n_head: int = field(default=4, metadata=bounds(1, 1024))
    """Attention heads per block (must divide n_embd)."""
    dropout: float = field(default=0.0, metadata=bounds(0, 1, high_open=True))
    """Dropout on embeddings, residuals and attention; 0 keeps PPO's probability ratios exact."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyLMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"TinyLMConfig: n_head={self.n_head} must divide n_embd={self.n_embd}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TinyLMConfig.dropout must be in [0, 1), got {self.dropout}")

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "TinyLMConfig":
        return TinyLMConfig(**data)

    def gpt2_config(self):
        """The transformers `GPT2Config` of this model."""
        from transformers import GPT2Config

        # bos/eos None: GPT-2's defaults (50256) lie outside a game vocabulary; we never use them.
        return GPT2Config(vocab_size=self.vocab_size, n_positions=self.n_positions, n_embd=self.n_embd,
                          n_layer=self.n_layer, n_head=self.n_head, resid_pdrop=self.dropout,
                          embd_pdrop=self.dropout, attn_pdrop=self.dropout, bos_token_id=None,
                          eos_token_id=None, pad_token_id=None)


class LMWithValueHead(nn.Module):
    """A Hugging Face causal LM plus a scalar value head on its trunk's last hidden state.

    forward(input_ids, attention_mask, past_key_values) -> (logits [B, T, V], values [B, T], past).
    values[:, t] estimates the return from the state after reading tokens 0..t, i.e. the state in
    which token t+1 is chosen; logits[:, t] is the distribution of token t+1.

    Works for any `*ForCausalLM` whose `base_model` is the trunk and whose output embeddings are
    the LM head (GPT-2, Llama/SmolLM2, Qwen, ...): we run the two parts ourselves so that one
    trunk pass feeds both heads and so that generation can apply the LM head to the last position
    only.
    """

    activation_tokens: int = 0
    """Activated LoRA (agents/lm/pretrained.py `LoRAConfig.activation_tokens`): the adapters act on a
    prompt's last `activation_tokens` tokens and on what follows, the base alone on the rest. The
    readers of prompts (`SharedPromptCache`, `LMPolicy.generate_naive`) honour it; 0: adapters
    (if any) on every token."""
    readings_mb: float = 3072.0
    """Megabytes the process's `BaseReadings` of this base may hold (agents/lm/pretrained.py
    `PretrainedLMConfig.readings_mb`)."""
    base_identity: Any = None
    """What makes two models the same base function (agents/lm/pretrained.py: its content hash, dtype
    and device), so that they share the base's readings (`base_readings`); None: unknown."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        hidden = int(lm.config.hidden_size)
        # CleanRL's critic init (orthogonal, std 1): values start O(1), trunk features unchanged.
        self.value_head = layer_init(nn.Linear(hidden, 1), std=1.0)

    @property
    def vocab_size(self) -> int:
        return int(self.lm.get_output_embeddings().out_features)

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model reads (None when its positions are unbounded, e.g. RoPE)."""
        config = self.lm.config
        if getattr(config, "model_type", "") == "gpt2":
            return int(config.n_positions)
        return None

    def trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              past_key_values: Any = None, position_ids: torch.Tensor | None = None,
              use_cache: bool = False, shared_prefix: Any = None) -> tuple[torch.Tensor, Any]:
        """Last hidden states [B, T, H] (after the final norm) and the KV cache (None unless use_cache).

        `shared_prefix`: per layer (keys, values) [1, kv heads, P, dim] of a prefix that every row
        continues, held once (agents/lm/kv_cache.py `shared_prefix_attention`); `past_key_values` and
        a 4-D `attention_mask` then cover each row's own columns after it. Generation only."""
        extra, attention = {}, contextlib.nullcontext()
        if shared_prefix is not None:
            from ludus.agents.lm.kv_cache import attention_over_shared_prefix

            extra, attention = {"shared_prefix": shared_prefix}, attention_over_shared_prefix(self.lm)
        with attention:
            out = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                     past_key_values=past_key_values, position_ids=position_ids,
                                     use_cache=use_cache, **extra)
        return out.last_hidden_state, (out.past_key_values if use_cache else None)

    def heads(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [..., V], values [...]) from hidden states [..., H]."""
        # float32 out whatever the trunk's dtype: sampling and log-probs are read in float32
        return self.lm.get_output_embeddings()(hidden).float(), self.values(hidden)

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """values [...] from hidden states [..., H], in the value head's dtype (float32 on a
        bfloat16 trunk too: agents/lm/pretrained.py)."""
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values: Any = None, position_ids: torch.Tensor | None = None,
                use_cache: bool = False) -> tuple[torch.Tensor, torch.Tensor, Any]:
        hidden, past = self.trunk(input_ids, attention_mask, past_key_values, position_ids,
                                  use_cache or past_key_values is not None)
        logits, values = self.heads(hidden)
        return logits, values, past


def build_tiny_lm(config: TinyLMConfig, seed: int) -> LMWithValueHead:
    """A freshly initialised tiny GPT-2 with a value head, seeded.

    transformers initialises weights from torch's global RNG; we seed it inside `fork_rng`, which
    restores the caller's RNG state afterwards, so no global state leaks out.
    """
    from transformers import GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LMWithValueHead(GPT2LMHeadModel(config.gpt2_config()))
    return model.eval()


@dataclass(frozen=True)
class LoadedLM:
    """A causal LM with its value head and (for pretrained models) its tokenizer."""

    model: LMWithValueHead
    tokenizer: Any | None
    """A transformers tokenizer, or None for models that read game token ids directly."""


_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_hf_causal_lm(path: str | os.PathLike, gguf_file: str | None = None) -> LoadedLM:
    """Any Hugging Face causal LM and its tokenizer from a LOCAL directory, with a new value head.

    The tokenizer is None when the directory holds no tokenizer files (and no GGUF file).
    Offline only: HF_HUB_OFFLINE=1 is set and every load passes ``local_files_only=True``, so a
    missing file is an error here, never a download. ``trust_remote_code`` stays off (no code
    from the model directory runs) and weights are read from safetensors or GGUF, never from a
    pickled ``pytorch_model.bin``. `gguf_file`: name of a GGUF file inside `path` (quantised
    weights are de-quantised to float32 by transformers; needs the `gguf` package).
    """
    directory = Path(path)
    if not directory.is_dir():
        raise LMError(f"no model directory at {directory}: give a local directory saved with "
                      f"save_pretrained or holding a GGUF file")
    if gguf_file is not None and not (directory / gguf_file).is_file():
        raise LMError(f"no GGUF file {gguf_file!r} in {directory}: give the file name inside that directory")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file is not None else {}
    # Weights come from GGUF or safetensors only: use_safetensors=True refuses pytorch_model.bin
    # (a pickle) instead of falling back to it.
    weights = {"gguf_file": gguf_file} if gguf_file is not None else {"use_safetensors": True}
    # A GGUF file carries its tokenizer; otherwise the tokenizer is optional (a model trained on
    # game token ids has none) and transformers would invent an empty one from config.json alone.
    has_tokenizer = gguf_file is not None or any((directory / name).is_file() for name in _TOKENIZER_MARKERS)
    try:
        lm = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32, **weights)
        tokenizer = (AutoTokenizer.from_pretrained(directory, local_files_only=True, **extra)
                     if has_tokenizer else None)
    except (OSError, ValueError) as exc:
        raise LMError(f"cannot load a causal LM from {directory}: {str(exc).splitlines()[0]}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the value head's init; the pretrained weights are not touched
        model = LMWithValueHead(lm)
    return LoadedLM(model.eval(), tokenizer)


# --------------------------------------------------------------------------------- sampling


def as_tensor(array: np.ndarray, dtype: np.dtype | type) -> torch.Tensor:
    """A tensor of `array` in `dtype`, sharing memory when possible; read-only arrays (e.g. the
    games' cached legal masks) are copied, since torch.from_numpy cannot honour read-only."""
    array = np.ascontiguousarray(array, dtype=dtype)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


# ------------------------------------------------------------------------------- snapshots

LM_ARCHITECTURE_FORMAT = "hf_causal_lm_with_value_head/1"
TOKENIZER_FILE_NAMES = frozenset({"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "chat_template.jinja", "vocab.json", "merges.txt"})
"""Tokenizer files a snapshot may carry: JSON and plain text only (no pickled or code files)."""
_UNSTABLE_CONFIG_KEYS = ("_name_or_path", "transformers_version")
"""Left out of the architecture record: they vary with where and with what the model was saved,
and the record is part of the snapshot's content hash."""


@dataclass(frozen=True)
class LMSnapshotParts:
    """What an "lm" snapshot stores, before agents/snapshot.py writes it."""

    architecture: dict
    """JSON-safe record that rebuilds the model: {"format": LM_ARCHITECTURE_FORMAT, "hf_config": {...}}."""
    tensors: dict[str, torch.Tensor]
    """The state dict (CPU copies, contiguous, no shared storage): weights.safetensors."""
    extra_files: dict[str, bytes]
    """Tokenizer files (names from TOKENIZER_FILE_NAMES); empty for models without a tokenizer."""


def lm_state_for_snapshot(model: LMWithValueHead, tokenizer: Any | None = None) -> LMSnapshotParts:
    """The architecture record, tensors and tokenizer files of a model, ready for a snapshot."""
    config = json.loads(model.lm.config.to_json_string(use_diff=False))
    for key in _UNSTABLE_CONFIG_KEYS:
        config.pop(key, None)
    tensors = {name: t.detach().to(device="cpu", copy=True).contiguous() for name, t in model.state_dict().items()}
    extra: dict[str, bytes] = {}
    if tokenizer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            for name in sorted(os.listdir(tmp)):
                if name in TOKENIZER_FILE_NAMES:
                    extra[name] = (Path(tmp) / name).read_bytes()
        if "tokenizer.json" not in extra and "vocab.json" not in extra:
            raise LMError("the tokenizer saved no tokenizer.json or vocab.json; only fast (JSON) tokenizers "
                          "can go into a snapshot")
    return LMSnapshotParts({"format": LM_ARCHITECTURE_FORMAT, "hf_config": config}, tensors, extra)


def _hf_config_from_architecture(architecture: Mapping[str, Any]):
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not isinstance(architecture, Mapping) or architecture.get("format") != LM_ARCHITECTURE_FORMAT:
        raise LMError(f"unknown LM architecture record: expected format {LM_ARCHITECTURE_FORMAT!r}; "
                      f"use the Ludus version that wrote the snapshot")
    hf_config = architecture.get("hf_config")
    if not isinstance(hf_config, Mapping) or not isinstance(hf_config.get("model_type"), str):
        raise LMError("LM architecture record has no hf_config with a model_type")
    model_type = hf_config["model_type"]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise LMError(f"model type {model_type!r} is not a causal LM known to transformers")
    # auto_map would name code to import from the model directory; a snapshot never runs code.
    settings = {k: v for k, v in hf_config.items() if k not in ("model_type", "auto_map")}
    try:
        return AutoConfig.for_model(model_type, **settings)
    except (TypeError, ValueError) as exc:
        raise LMError(f"bad hf_config in the LM architecture record: {exc}") from None


def _build_from_hf_config(hf_config) -> LMWithValueHead:
    from transformers import AutoModelForCausalLM

    return LMWithValueHead(AutoModelForCausalLM.from_config(hf_config))


def lm_architecture_mismatch(architecture: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> str:
    """Why tensors of these shapes cannot be the weights of this architecture; '' if they can.

    The model is built on the meta device (shapes only, no memory), so a hostile record (say
    n_embd=10**9) costs nothing before the weights prove it. Raises LMError for a bad record.
    """
    hf_config = _hf_config_from_architecture(architecture)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in _build_from_hf_config(hf_config).state_dict().items()}
    return shape_mismatch(expected, shapes)


def lm_from_snapshot_files(architecture: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                           extra_files: Mapping[str, bytes] | None = None) -> LoadedLM:
    """Rebuild a model (and its tokenizer, if the snapshot has one) from an "lm" snapshot's parts.

    `architecture`: the manifest's architecture record; `tensors`: weights.safetensors loaded with
    safetensors; `extra_files`: {file name: bytes} of the tokenizer files. JSON, safetensors and
    tokenizer JSON/text only: nothing is unpickled and no code from the snapshot runs.
    """
    problem = lm_architecture_mismatch(architecture, {k: tuple(t.shape) for k, t in tensors.items()})
    if problem:
        raise LMError(f"LM weights do not match the architecture: {problem}")
    if any(not t.is_floating_point() for t in tensors.values()):
        raise LMError("LM weights do not match the architecture: non-floating-point tensors")
    hf_config = _hf_config_from_architecture(architecture)
    with torch.random.fork_rng(devices=[]):  # init is overwritten by the weights; keep global RNG intact
        model = _build_from_hf_config(hf_config)
    model.load_state_dict(dict(tensors), strict=True)
    model.eval()
    tokenizer = None
    files = dict(extra_files or {})
    unknown = sorted(set(files) - TOKENIZER_FILE_NAMES)
    if unknown:
        raise LMError(f"LM snapshot has unknown extra files {unknown}: only tokenizer files "
                      f"{sorted(TOKENIZER_FILE_NAMES)} are read")
    if files:
        os.environ["HF_HUB_OFFLINE"] = "1"
        from transformers import AutoTokenizer

        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():
                (Path(tmp) / name).write_bytes(data)
            try:
                tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise LMError(f"cannot rebuild the tokenizer of the LM snapshot: {str(exc).splitlines()[0]}") from None
    return LoadedLM(model, tokenizer)


def frozen_copy(model: LMWithValueHead) -> LMWithValueHead:
    """A deep copy with gradients off, in eval mode (a reference or opponent model)."""
    clone = copy.deepcopy(model)
    clone.requires_grad_(False)
    return clone.eval()
