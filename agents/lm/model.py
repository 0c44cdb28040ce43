"""Language-model policies: a causal LM with a value head, acting one token at a time.

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

Sampling uses the caller's `np.random.Generator`, never torch's global RNG: one uniform number per
(row, new token) and the inverse of the cumulative distribution (token = first index whose
cumulative probability exceeds u). Illegal tokens have probability exactly 0 (their logit is
-1e9, ludus.agents.nets.MASKED_LOGIT), so the cumulative sum is flat across them and they can never be
picked. Because the numbers are drawn per (row, step) up front, batched and per-sample generation
consume them identically and give the same tokens for the same Generator state.

Snapshots store the model as JSON (the Hugging Face config) plus safetensors (the state dict) and,
for pretrained models, the tokenizer's JSON/text files: never pickle (`lm_state_for_snapshot`,
`lm_from_snapshot_files`). agents/snapshot.py writes them as kind "lm".
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import tempfile
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ludus.agents.nets import layer_init, masked_logits, shape_mismatch
from ludus.agents.policy import ActBatch, ActOutput
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


def sample_tokens(logits: torch.Tensor, legal_mask: np.ndarray | None, uniforms: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """One token per row of [B, V] logits, masked to `legal_mask` [B, V] (None = all legal).

    `uniforms` [B] in [0, 1): inverse-CDF sampling; None: greedy (argmax). Returns (tokens [B]
    int64, log-probs [B] float32 under the masked softmax).
    """
    logits = logits.float()
    if legal_mask is not None:
        legal = as_tensor(legal_mask, bool)
        if not bool(legal.any(dim=-1).all()):
            raise ValueError("a row of the legal mask has no legal token")
        logits = masked_logits(logits, legal)
    log_pi = torch.log_softmax(logits, dim=-1)
    if uniforms is None:
        tokens = log_pi.argmax(dim=-1)
    else:
        cdf = torch.cumsum(log_pi.double().exp(), dim=-1)
        # u scaled by the total mass (1 up to rounding) so that the count below is at most V-1.
        u = torch.from_numpy(np.asarray(uniforms, dtype=np.float64)) * cdf[:, -1]
        tokens = (cdf <= u[:, None]).sum(dim=-1)
    chosen = log_pi.gather(1, tokens[:, None]).squeeze(1)
    if not bool(torch.isfinite(chosen).all()) or bool((chosen < -1e8).any()):
        # Only non-finite logits can get here: an illegal token has probability exactly 0.
        raise FloatingPointError("the model produced non-finite logits; an illegal token was sampled")
    return tokens.numpy().astype(np.int64), chosen.numpy().astype(np.float32)


LegalMaskFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""legal_mask_fn(rows [b] int, new_tokens [b, s] int64) -> [b, V] bool: the legal next tokens of
prompt rows `rows` after they generated `new_tokens` (called for unfinished rows only)."""


@dataclass(frozen=True)
class Generation:
    """Tokens generated for B prompts."""

    tokens: np.ndarray
    """[B, max_new_tokens] int64 generated tokens, the stop token included, then padding."""
    lengths: np.ndarray
    """[B] int64 number of generated tokens per row (the stop token counts)."""
    log_probs: np.ndarray
    """[B, max_new_tokens] float32 log pi(token) under the masked distribution; 0 after `lengths`."""
    values: np.ndarray
    """[B, max_new_tokens] float32 value of the state each token was chosen in; 0 after `lengths`."""

    def row(self, i: int) -> list[int]:
        return self.tokens[i, : self.lengths[i]].tolist()


class LMPolicy:
    """A `Policy` for token games, plus batched generation with the KV cache.

    Observations are int64 token ids, right-padded with `pad_id`; a row's length is one past its
    last non-pad token (a pad id inside the sequence is read as a token). The legal mask is over
    the vocabulary. The policy reads the model it was given (no copy), so a learner's policy
    follows its updates.
    """

    needs_history = False

    def __init__(self, model: LMWithValueHead, pad_id: int = 0):
        self.model = model
        self.pad_id = int(pad_id)

    # -- the Policy protocol --------------------------------------------------------------

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        """Next token of every row: sampled (one uniform per row from `rng`) or greedy."""
        obs = np.asarray(batch.obs)
        if self.model.activation_tokens:
            raise LMError("a model with activated adapters reads prompts through generate, not act")
        if obs.ndim != 2 or not np.issubdtype(obs.dtype, np.integer):
            raise ValueError(f"LMPolicy reads [N, L] integer token rows, got {obs.dtype} {obs.shape}")
        lengths = self.row_lengths(obs)
        width = int(lengths.max())
        ids = as_tensor(obs[:, :width], np.int64)
        # Right padding needs no mask for a causal model (real tokens never see later pads); the
        # mask only keeps transformers from warning about pads when the config names a pad id.
        attention = torch.from_numpy((np.arange(width)[None, :] < lengths[:, None]).astype(np.int64))
        uniforms = None if greedy else rng.random(len(obs))
        with torch.inference_mode():
            hidden, _ = self.model.trunk(ids, attention)
            last = hidden[torch.arange(len(obs)), torch.from_numpy(lengths - 1)]
            logits, values = self.model.heads(last)
            tokens, log_probs = sample_tokens(logits, batch.mask, uniforms)
        return ActOutput(tokens, log_probs, values.numpy().astype(np.float32))

    def row_lengths(self, obs: np.ndarray) -> np.ndarray:
        """[N] length of each right-padded row: one past its last non-pad token."""
        real = obs != self.pad_id
        if not real.any(axis=1).all():
            raise ValueError("an observation row holds only padding: the model needs at least one token")
        return (obs.shape[1] - np.argmax(real[:, ::-1], axis=1)).astype(np.int64)

    # -- generation -----------------------------------------------------------------------

    def _check_prompts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        rows = [list(map(int, p)) for p in prompts]
        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("generate needs at least one prompt, each with at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        limit = self.model.max_positions
        longest = max(len(r) for r in rows) + max_new_tokens
        if limit is not None and longest > limit:
            raise ValueError(f"prompt + new tokens need {longest} positions, the model has {limit}: "
                             f"shorten the prompts or generate fewer tokens")
        return rows

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, rng: np.random.Generator,
                 stop_token: int | Sequence[int] | None, legal_mask_fn: LegalMaskFn | None = None,
                 greedy: bool = False, reuse_prefix: bool = True, temperature: float = 1.0,
                 store: PromptStore | BaseReadings | None = None) -> Generation:
        """Continue every prompt by up to `max_new_tokens`, all rows in one batch per step.

        The prompts are read into a `SharedPromptCache`: with `reuse_prefix`, their common prefix
        (a game's rules) and each distinct prompt are read once, and every row's tokens are packed
        after its prompt; without, every row is read alone (the reference). Each step costs one
        token per row. A row stops after emitting `stop_token` (or any of several stop tokens) and
        adds no more columns. `store`: prompts read by earlier calls with the same weights (or, for
        activated adapters, `BaseReadings`: the base's readings, for any weights). Tokens are drawn from
        softmax(logits / temperature); the log-probs returned are of that distribution.
        """
        rows = self._check_prompts(prompts, max_new_tokens)
        batch = len(rows)
        stops = np.asarray([] if stop_token is None else stop_token, dtype=np.int64).reshape(-1)
        uniforms = None if greedy else rng.random((batch, max_new_tokens))
        out = _GenerationBuffers(batch, max_new_tokens, self.pad_id)
        with torch.inference_mode():
            cache = SharedPromptCache(self.model, rows, share=reuse_prefix, store=store if reuse_prefix else None,
                                      prefix_once=reuse_prefix)
            # every step appends at most one column per row of an entry
            cache.reserve(max_new_tokens * int(np.bincount(cache.entry_of).max()))
            hidden = cache.prompt_hidden[torch.from_numpy(cache.entry_of)]
            live = np.arange(batch)  # rows still generating
            for step in range(max_new_tokens):
                logits, values = self.model.heads(hidden)
                if temperature != 1.0:
                    logits = logits.float() / temperature
                mask = None if legal_mask_fn is None else legal_mask_fn(live, out.tokens[live, :step])
                tokens, log_probs = sample_tokens(logits, mask, None if uniforms is None else uniforms[live, step])
                out.record(live, step, tokens, log_probs, values.numpy())
                done = np.isin(tokens, stops)
                if done.all() or step == max_new_tokens - 1:
                    break
                # finished rows stop adding columns (an entry left without rows leaves the cache);
                # the rest append their token to their entry
                live, tokens = live[~done], tokens[~done]
                cache.keep_entries(np.unique(cache.entry_of[live]))
                entries, slots = cache.entry_of[live], cache.slot_of[live]
                width = int(np.bincount(entries, minlength=cache.num_entries).max())
                column = np.zeros(len(live), dtype=np.int64)
                order = np.lexsort((slots, entries))
                starts = np.searchsorted(entries[order], entries[order])
                column[order] = np.arange(len(live)) - starts
                ids = np.zeros((cache.num_entries, width), dtype=np.int64)
                owner = np.full((cache.num_entries, width), -2, dtype=np.int64)
                positions = np.zeros((cache.num_entries, width), dtype=np.int64)
                ids[entries, column], owner[entries, column] = tokens, slots
                positions[entries, column] = cache.prompt_length[entries] + step
                step_hidden = cache.extend(ids, owner, positions)
                hidden = step_hidden[torch.from_numpy(entries), torch.from_numpy(column)]
        return out.freeze()

    def generate_naive(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, rng: np.random.Generator,
                       stop_token: int | None, legal_mask_fn: LegalMaskFn | None = None,
                       greedy: bool = False) -> Generation:
        """The same as `generate`, one prompt at a time (no batching; each prompt keeps its own KV
        cache). The reference that batched generation is checked and benchmarked against; it
        consumes `rng` exactly like `generate`, so both give the same tokens."""
        rows = self._check_prompts(prompts, max_new_tokens)
        uniforms = None if greedy else rng.random((len(rows), max_new_tokens))
        out = _GenerationBuffers(len(rows), max_new_tokens, self.pad_id)
        activated = self.model.activation_tokens
        with torch.inference_mode():
            for i, row in enumerate(rows):
                past = None
                if activated:  # the prompt before its activation tokens: the base's reading
                    from ludus.agents.lm.pretrained import adapter_disabled

                    head = len(_split_activated(row, activated)[0])
                    with adapter_disabled(self.model):
                        _, past = self.model.trunk(torch.tensor([row[:head]]), None, None, torch.arange(head)[None],
                                                   use_cache=True)
                    row = row[head:]
                start = 0 if past is None else past.get_seq_length()
                hidden, past = self.model.trunk(torch.tensor([row], dtype=torch.int64), None, past,
                                                torch.arange(start, start + len(row))[None], use_cache=True)
                for step in range(max_new_tokens):
                    logits, values = self.model.heads(hidden[:, -1])
                    mask = None
                    if legal_mask_fn is not None:
                        mask = legal_mask_fn(np.array([i]), out.tokens[i: i + 1, :step])
                    u = None if uniforms is None else uniforms[i: i + 1, step]
                    tokens, log_probs = sample_tokens(logits, mask, u)
                    out.record(np.array([i]), step, tokens, log_probs, values.numpy())
                    if (stop_token is not None and tokens[0] == stop_token) or step == max_new_tokens - 1:
                        break
                    position = torch.tensor([[start + len(row) + step]])
                    hidden, past = self.model.trunk(torch.from_numpy(tokens[:, None]), None, past, position,
                                                    use_cache=True)
        return out.freeze()


class PromptStore:
    """Keys, values and last hidden state of prompts already read, by their tokens (LRU).

    Valid for one set of weights only: whoever changes the weights clears it. A league asks the
    same positions over and over (every turn of every match, and again when a response is
    retried), so a policy that keeps its prompts reads each one once per weights version and play
    task (runners clear it at each task: `ludus.agents.policy.KeepsReadings`); and a
    new prompt that begins like one read before (the next turn of the same game: the same
    rules, position and history, then the new moves) reads only its new tokens after the keys and
    values of the tokens they share (`longest_shared`: in a causal model those depend on those
    tokens only), as the prefix caches of vLLM and SGLang do.
    Bounded in bytes, not entries: a prompt's keys and values grow with its length (SmolLM2-135M
    in fp32: ~46 KB per token, ~9 MB for a 200-token tic-tac-toe prompt), and a game whose
    positions are all distinct would otherwise fill memory with them."""

    SEARCHED = 256
    """Stored prompts `longest_shared` compares a new one with, most recently used first."""

    def __init__(self, capacity_mb: float = 512.0):
        self.capacity_bytes = int(capacity_mb * 2**20)
        self.bytes = 0
        self.entries: "OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]]" = \
            OrderedDict()
        self.tokens: dict[tuple[int, ...], np.ndarray] = {}

    @staticmethod
    def _size(layers: list[tuple[torch.Tensor, torch.Tensor]], hidden: torch.Tensor) -> int:
        return sum(k.nbytes + v.nbytes for k, v in layers) + hidden.nbytes

    def get(self, prompt: tuple[int, ...]):
        entry = self.entries.get(prompt)
        if entry is not None:
            self.entries.move_to_end(prompt)
        return entry

    def longest_shared(self, prompt: Sequence[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None:
        """(n, layers) of the stored prompt that shares the most leading tokens with `prompt`,
        n of them (at most len(prompt) - 1: the last token is always read, for its hidden state);
        the first n columns of its `layers` are `prompt`'s. None if no stored prompt shares one."""
        tokens = np.asarray(prompt, dtype=np.int64)
        best, best_key = 0, None
        # the most recently used prompts only: an earlier turn of the same game is among them, and
        # a store of many short prompts (a tiny model's) would make the search cost more than a read
        for key in itertools.islice(reversed(self.entries), self.SEARCHED):
            stored = self.tokens[key]
            n = min(len(stored), len(tokens) - 1)
            differ = np.flatnonzero(stored[:n] != tokens[:n])
            shared = int(differ[0]) if len(differ) else n
            if shared > best:
                best, best_key = shared, key
        if best_key is None:
            return None
        self.entries.move_to_end(best_key)
        return best, self.entries[best_key][0]

    def put(self, prompt: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]], hidden: torch.Tensor) -> None:
        if prompt in self.entries:
            self.bytes -= self._size(*self.entries[prompt])
        self.entries[prompt] = (layers, hidden)
        self.tokens[prompt] = np.asarray(prompt, dtype=np.int64)
        self.entries.move_to_end(prompt)
        self.bytes += self._size(layers, hidden)
        while self.bytes > self.capacity_bytes and len(self.entries) > 1:  # the newest stays
            key, evicted = self.entries.popitem(last=False)
            del self.tokens[key]
            self.bytes -= self._size(*evicted)

    def clear(self) -> None:
        self.entries.clear()
        self.tokens.clear()
        self.bytes = 0


class BaseReadings:
    """The base model's keys and values of the prompts that activated adapters read, each the same
    floats however it came to be read, kept for the whole run (LRU, bounded in bytes).

    With activated adapters (`LMWithValueHead.activation_tokens`) a prompt up to its activation
    tokens is read by the base alone, so its keys and values hold for every version of the
    adapters, and a league asks the same positions iteration after iteration (tic-tac-toe's
    openings, Kuhn poker's twelve states). A `PromptStore` must be emptied at every runner task
    and learner update all the same, because a batched reading's rounding depends on what else is
    in the batch, so a kept reading would differ in the last bits from the one a resumed run makes
    afresh. Here every prompt is read alone, in blocks of `block` tokens, each block from its own
    tokens and the keys and values of the blocks before it: always the same shapes, so the same
    floats at any time and in any company (for the process's torch thread count), and a resumed run
    computes exactly what was kept. A block is keyed by all the tokens up to its end (as vLLM's
    prefix caching chains its block hashes), so prompts that begin alike (the rules) share theirs,
    and an evicted block is simply read again.

    Tensors are kept out of inference mode, so that a learner's gradient pass can read them."""

    def __init__(self, capacity_mb: float = 3072.0, block: int = 64):
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = block
        self.capacity_bytes = int(capacity_mb * 2**20)
        self.bytes = 0
        self.blocks: "OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]]" = OrderedDict()
        self.computed = 0
        """Blocks read by the model (the rest came from the store)."""

    def read(self, model: "LMWithValueHead", prompt: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) [1, kv heads, len(prompt), dim] of `prompt`, read by `model` as
        the caller has it (the base alone: `SharedPromptCache` switches the adapters off)."""
        tokens = tuple(int(t) for t in prompt)
        blocks: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for start in range(0, len(tokens), self.block):
            end = min(start + self.block, len(tokens))
            layers = self.blocks.get(tokens[:end])
            if layers is None:
                layers = self._read_block(model, tokens[start:end], start, blocks)
                self._put(tokens[:end], layers)
            else:
                self.blocks.move_to_end(tokens[:end])
            blocks.append(layers)
        return self._joined(blocks)

    @staticmethod
    def _joined(blocks: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.cat([b[layer][0] for b in blocks], dim=2), torch.cat([b[layer][1] for b in blocks], dim=2))
                for layer in range(len(blocks[0]))]

    def _read_block(self, model: "LMWithValueHead", tokens: tuple[int, ...], start: int,
                    before: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from transformers import DynamicCache

        self.computed += 1
        with torch.inference_mode(False), torch.no_grad():
            cache = None
            if before:
                cache = DynamicCache()
                for layer, (keys, values) in enumerate(self._joined(before)):
                    cache.update(keys, values, layer)
            positions = torch.arange(start, start + len(tokens))[None]
            _, past = model.trunk(torch.tensor([tokens], dtype=torch.int64), None, cache, positions, use_cache=True)
            return [(layer.keys[:, :, start:].clone(), layer.values[:, :, start:].clone()) for layer in past.layers]

    def _put(self, key: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.blocks[key] = layers
        self.bytes += sum(k.nbytes + v.nbytes for k, v in layers)
        while self.bytes > self.capacity_bytes and len(self.blocks) > 1:  # the newest stays
            _, evicted = self.blocks.popitem(last=False)
            self.bytes -= sum(k.nbytes + v.nbytes for k, v in evicted)


_BASE_READINGS: dict[tuple[Any, int], BaseReadings] = {}


def base_readings(model: "LMWithValueHead") -> BaseReadings:
    """The `BaseReadings` of `model`'s base at this torch thread count (a reading is the same floats
    for one thread count), shared by every model of the same base in the process
    (`LMWithValueHead.base_identity`): a learner trains on the positions that the runners in its
    process have just read for play, and frozen members share their base's. A model without an
    identity has its own. The readings hold the most megabytes that any of their models asks for
    (`LMWithValueHead.readings_mb`)."""
    threads = torch.get_num_threads()
    if model.base_identity is None:
        table, key = model.__dict__.setdefault("_ludus_base_readings", {}), (None, threads)
    else:
        table, key = _BASE_READINGS, (model.base_identity, threads)
    readings = table.get(key)
    if readings is None:
        readings = table[key] = BaseReadings(capacity_mb=model.readings_mb)
    readings.capacity_bytes = max(readings.capacity_bytes, int(model.readings_mb * 2**20))
    return readings


class SharedPromptCache:
    """A KV cache in which rows that share a prompt share its keys and values.

    Rows are grouped by DISTINCT prompt; a league asks the same position many times (Kuhn poker
    has 12 information states), and every prompt starts with the same chat header and rules. The
    common prefix is read once, each distinct prompt once, and the rows' own tokens (sampled ones
    while generating, a response while training) are packed after their prompt in the same cache
    entry, each row attending to its prompt and to its own earlier tokens only (a 4-D attention
    mask, as tree-attention decoding does). No row holds a copy of its prompt's keys and values,
    so a step costs the prompt once per entry, not once per row. A prompt asked by more than
    `rows_per_entry` rows is split over several entries (its prompt computed once, its cache
    copied), so that the packed columns of the entries stay balanced.

    With `prefix_once` (generation: no gradients, an `LMWithValueHead`), the common prefix is not
    even copied into every entry: it is held once (`prefix`, per layer [1, kv heads, P, dim]) and
    read by all rows' queries together (agents/lm/kv_cache.py `shared_prefix_attention`); `past` and
    the masks then cover each entry's columns after it.

    Position ids count the real tokens before a token in its own row, so each row is computed
    exactly as if it were alone. Gradients flow through the shared prompt as if each row had its
    own copy (training reads responses this way). With a `store` (no gradients), prompts read
    before are taken from it and new ones are added to it.

    Activated adapters (`LMWithValueHead.activation_tokens`, or `activated` per row: how many of
    its last tokens the adapters read): each prompt is read by the base alone up to those tokens
    (adapters off, no gradients: the store's readings then hold for every version of the
    adapters), and they are then read as the rows' common columns with the adapters as the caller
    has them, gradients flowing if enabled. Their prompts' readings then come from a `store` that
    is a `BaseReadings` (kept for the run) or a `PromptStore`, or are read here.
    """

    def __init__(self, model: "LMWithValueHead", rows: Sequence[Sequence[int]], rows_per_entry: int | None = None,
                 share: bool = True, store: PromptStore | BaseReadings | None = None, prefix_once: bool = False,
                 activated: Sequence[int] | None = None):
        self.model = model
        batch = len(rows)
        if activated is None:
            activated = [getattr(model, "activation_tokens", 0)] * batch
        if any(activated) and not all(activated):
            raise LMError("a batch of prompts reads activated adapters on every row or on none")
        if share:
            index: dict[tuple[int, ...], int] = {}
            prompt_of = np.array([index.setdefault(tuple(r), len(index)) for r in rows], dtype=np.int64)
            distinct = [list(r) for r in index]
        else:  # the reference: every row its own entry, nothing shared
            prompt_of, distinct = np.arange(batch), [list(r) for r in rows]
        cap = rows_per_entry or max(8, -(-batch // len(distinct)))
        # entries: chunks of at most `cap` rows of one distinct prompt
        self.entry_of = np.zeros(batch, dtype=np.int64)
        self.slot_of = np.zeros(batch, dtype=np.int64)  # the row's index within its entry
        entry_prompt: list[int] = []
        for d in range(len(distinct)):
            members = np.flatnonzero(prompt_of == d)
            for start in range(0, len(members), cap):
                chunk = members[start:start + cap]
                self.entry_of[chunk] = len(entry_prompt)
                self.slot_of[chunk] = np.arange(len(chunk))
                entry_prompt.append(d)
        self.num_entries = len(entry_prompt)
        tails: list[list[int]] = []
        with contextlib.ExitStack() as base_alone:
            if activated[0]:
                from ludus.agents.lm.pretrained import adapter_disabled

                count_of: dict[int, int] = {}
                for d, n in zip(prompt_of.tolist(), activated):
                    if count_of.setdefault(d, int(n)) != n:
                        raise LMError("rows with the same prompt read it with different activation tokens")
                split = [_split_activated(distinct[d], count_of[d]) for d in range(len(distinct))]
                distinct, tails = [head for head, _ in split], [tail for _, tail in split]
                base_alone.enter_context(torch.no_grad())
                base_alone.enter_context(adapter_disabled(model))
            if isinstance(store, BaseReadings):
                if not tails:
                    raise LMError("BaseReadings hold the prompts of activated adapters only (lora.activation_tokens)")
                past, hidden_last, real, self.prefix = self._read_from_base_readings(model, distinct, store,
                                                                                      prefix_once)
            elif store is None:
                past, hidden_last, real, self.prefix = self._read(model, distinct, share, prefix_once and share)
            else:
                past, hidden_last, real, self.prefix = self._read_with_store(model, distinct, store, prefix_once)
        prefix_length = 0 if self.prefix is None else int(self.prefix[0][0].shape[2])
        tail_hidden = None
        if tails:
            past, tail_hidden, real = self._read_tails(model, past, real, self.prefix, tails)
            hidden_last = tail_hidden[:, -1]
        count = len(distinct)
        owner = np.where(real, -1, -2)
        to_entries = torch.from_numpy(np.array(entry_prompt, dtype=np.int64))
        if self.num_entries != count:
            past.batch_select_indices(to_entries)
        self.past = past
        self.owner = owner[entry_prompt]
        self.prompt_hidden = hidden_last[to_entries]
        """[entries, H] hidden state of each entry's last prompt token."""
        self.tail_hidden = None if tail_hidden is None else tail_hidden[to_entries]
        """With activated adapters, [entries, longest tail, H] hidden states of each entry's activation
        tokens, LEFT-padded (its prompt's last token in the last column); else None."""
        self.prompt_length = real.sum(axis=1)[entry_prompt] + prefix_length
        """[entries] real tokens of each entry's prompt."""

    @staticmethod
    def _shared_length(distinct: list[list[int]]) -> int:
        """Leading tokens that all the distinct prompts share and that are read once for them (0
        for a single prompt). Every prompt keeps at least one token after them: its last token's
        hidden state gives its rows' first logits."""
        if len(distinct) < 2:
            return 0
        return min(common_prefix_length(distinct), min(len(r) for r in distinct) - 1)

    @classmethod
    def _read(cls, model: "LMWithValueHead", distinct: list[list[int]], share: bool, prefix_once: bool = False
              ) -> tuple[Any, torch.Tensor, np.ndarray, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Read the prompts: their common prefix once, then each one's rest, LEFT-padded so that
        every prompt ends in the last column. Returns (KV cache [D, ...], last hidden [D, H],
        real [D, T]: which cache columns hold prompt tokens, the prefix's keys and values per
        layer if `prefix_once` holds them apart from the cache, else None)."""
        count = len(distinct)
        shared = cls._shared_length(distinct) if share else 0
        past, held = None, None
        if shared > 0:
            prefix = torch.tensor([distinct[0][:shared]], dtype=torch.int64)
            _, past = model.trunk(prefix, None, None, torch.arange(shared)[None], use_cache=True)
            if prefix_once:
                held, past = [(layer.keys, layer.values) for layer in past.layers], None
            else:
                past.batch_repeat_interleave(count)
        suffixes = [row[shared:] for row in distinct]
        longest = max(len(r) for r in suffixes)
        ids = np.zeros((count, longest), dtype=np.int64)
        real = np.zeros((count, shared + longest), dtype=bool)
        real[:, :shared] = True
        for i, row in enumerate(suffixes):
            ids[i, longest - len(row):] = row
            real[i, shared + longest - len(row):] = True
        positions = torch.from_numpy(np.maximum(np.cumsum(real, axis=1) - 1, 0)[:, shared:])
        owner = np.where(real, -1, -2)
        if held is None:
            mask = cls._mask(owner[:, :shared], owner[:, shared:])
            hidden, past = model.trunk(torch.from_numpy(ids), mask, past, positions, use_cache=True)
            return past, hidden[:, -1], real, None
        mask = cls._mask(owner[:, :0], owner[:, shared:])
        hidden, past = model.trunk(torch.from_numpy(ids), mask, None, positions, use_cache=True, shared_prefix=held)
        return past, hidden[:, -1], real[:, shared:], held

    @classmethod
    def _read_with_store(cls, model: "LMWithValueHead", distinct: list[list[int]], store: PromptStore,
                         prefix_once: bool = False
                         ) -> tuple[Any, torch.Tensor, np.ndarray, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """`_read` for the prompts the store lacks (added to it); the others come from the store.
        A missing prompt that shares leading tokens with a stored one reads only the rest
        (`_read_after`). The cache is assembled LEFT-padded from each prompt's own columns (after
        the prompts' common prefix, held apart, with `prefix_once`)."""
        keys = [tuple(r) for r in distinct]
        # this call's entries are held here: the store may evict some of them while others are added
        entries = [store.get(key) for key in keys]
        missing = [i for i, entry in enumerate(entries) if entry is None]
        stems = {i: store.longest_shared(distinct[i]) for i in missing}
        fresh = [i for i in missing if stems[i] is None]
        if fresh:
            past, hidden, real, _ = cls._read(model, [distinct[i] for i in fresh], share=True)
            for j, i in enumerate(fresh):
                entries[i] = (cls._own_columns(past, real, j), hidden[j].clone())
        extended = [i for i in missing if stems[i] is not None]
        if extended:
            read = cls._read_after(model, [stems[i] for i in extended], [distinct[i] for i in extended])
            for i, entry in zip(extended, read):
                entries[i] = entry
        for i in missing:
            store.put(keys[i], *entries[i])
        shared = cls._shared_length(distinct) if prefix_once else 0
        held = [(k[:, :, :shared], v[:, :, :shared]) for k, v in entries[0][0]] if shared > 0 else None
        cache, real = cls._assemble([layers for layers, _ in entries], skip=shared)
        return cache, torch.stack([hidden for _, hidden in entries]), real, held

    @classmethod
    def _read_from_base_readings(cls, model: "LMWithValueHead", heads: list[list[int]], readings: BaseReadings,
                                 prefix_once: bool) -> tuple[Any, None, np.ndarray,
                                                             list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """`_read` of prompts before their activation tokens, from `readings` (no last hidden state:
        their activation tokens give it)."""
        layers = [readings.read(model, head) for head in heads]
        shared = cls._shared_length(heads) if prefix_once else 0
        held = [(k[:, :, :shared], v[:, :, :shared]) for k, v in layers[0]] if shared > 0 else None
        cache, real = cls._assemble(layers, skip=shared)
        return cache, None, real, held

    @classmethod
    def _read_tails(cls, model: "LMWithValueHead", past: Any, real: np.ndarray,
                    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None, tails: list[list[int]]
                    ) -> tuple[Any, torch.Tensor, np.ndarray]:
        """Append each prompt's activation tokens (LEFT-padded, so that every prompt still ends in
        the last column) after its base reading `past`; returns the cache, the tails' hidden states
        [D, longest tail, H] and the real columns."""
        count, longest = len(tails), max(len(t) for t in tails)
        ids = np.zeros((count, longest), dtype=np.int64)
        owner = np.full((count, longest), -2, dtype=np.int64)
        positions = np.zeros((count, longest), dtype=np.int64)
        read = real.sum(axis=1) + (0 if prefix is None else int(prefix[0][0].shape[2]))
        for i, tail in enumerate(tails):
            ids[i, longest - len(tail):] = tail
            owner[i, longest - len(tail):] = -1
            positions[i, longest - len(tail):] = read[i] + np.arange(len(tail))
        mask = cls._mask(np.where(real, -1, -2), owner)
        extra = {} if prefix is None else {"shared_prefix": prefix}
        hidden, past = model.trunk(torch.from_numpy(ids), mask, past, torch.from_numpy(positions), use_cache=True,
                                   **extra)
        return past, hidden, np.concatenate([real, owner == -1], axis=1)

    @staticmethod
    def _assemble(prompts: list[list[tuple[torch.Tensor, torch.Tensor]]], skip: int = 0) -> tuple[Any, np.ndarray]:
        """A cache of the prompts' per-layer keys and values ([1, heads, n, d] each) after their
        first `skip` columns, LEFT-padded to the longest, and which of its columns are real."""
        from transformers import DynamicCache

        lengths = [layers[0][0].shape[2] - skip for layers in prompts]
        longest = max(lengths)
        real = np.zeros((len(prompts), longest), dtype=bool)
        for i, n in enumerate(lengths):
            real[i, longest - n:] = True
        cache = DynamicCache()
        for layer in range(len(prompts[0])):
            k0, v0 = prompts[0][layer]
            k = k0.new_zeros((len(prompts), k0.shape[1], longest, k0.shape[3]))
            v = v0.new_zeros((len(prompts), v0.shape[1], longest, v0.shape[3]))
            for i, layers in enumerate(prompts):
                n = lengths[i]
                k[i, :, longest - n:] = layers[layer][0][0, :, skip:]
                v[i, :, longest - n:] = layers[layer][1][0, :, skip:]
            cache.update(k, v, layer)
        return cache, real

    @classmethod
    def _read_after(cls, model: "LMWithValueHead", stems: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]],
                    prompts: list[list[int]]) -> list[tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]]:
        """Each prompt's (keys and values per layer, last hidden state), reading only the tokens
        after its stem (n shared leading tokens and a stored prompt's layers, whose first n
        columns are this prompt's), the rest LEFT-padded after the stems."""
        shared = [n for n, _ in stems]
        cache, real_old = cls._assemble([[(k[:, :, :n], v[:, :, :n]) for k, v in layers] for n, layers in stems])
        suffixes = [row[n:] for row, n in zip(prompts, shared)]
        longest = max(len(r) for r in suffixes)
        ids = np.zeros((len(prompts), longest), dtype=np.int64)
        positions = np.zeros((len(prompts), longest), dtype=np.int64)
        real_new = np.zeros((len(prompts), longest), dtype=bool)
        for i, row in enumerate(suffixes):
            ids[i, longest - len(row):] = row
            positions[i, longest - len(row):] = shared[i] + np.arange(len(row))
            real_new[i, longest - len(row):] = True
        mask = cls._mask(np.where(real_old, -1, -2), np.where(real_new, -1, -2))
        hidden, past = model.trunk(torch.from_numpy(ids), mask, cache, torch.from_numpy(positions), use_cache=True)
        real = np.concatenate([real_old, real_new], axis=1)
        return [(cls._own_columns(past, real, j), hidden[j, -1].clone()) for j in range(len(prompts))]

    @staticmethod
    def _own_columns(past: Any, real: np.ndarray, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s keys and values per layer ([1, heads, n, d] copies), its real columns only."""
        columns = torch.from_numpy(np.flatnonzero(real[row]))
        return [(layer.keys[row:row + 1, :, columns].clone(), layer.values[row:row + 1, :, columns].clone())
                for layer in past.layers]

    @staticmethod
    def _mask(old_owner: np.ndarray, new_owner: np.ndarray) -> torch.Tensor:
        """[E, 1, K, old + K] bool: new column q (owned by slot r) sees the prompt's columns and
        the earlier-or-same columns of slot r; a prompt column (r = -1) sees earlier prompt columns;
        padding sees itself only (so no row of the softmax is empty)."""
        new_k = new_owner.shape[1]
        owners = np.concatenate([old_owner, new_owner], axis=1)
        q_owner = new_owner[:, :, None]
        k_owner = owners[:, None, :]
        k_index = np.arange(owners.shape[1])[None, None, :]
        q_index = (old_owner.shape[1] + np.arange(new_k))[None, :, None]
        causal = k_index <= q_index
        sees = causal & ((k_owner == -1) | ((k_owner == q_owner) & (q_owner >= 0)))
        sees |= (k_index == q_index) & (q_owner == -2)
        return torch.from_numpy(sees[:, None])

    def keep_entries(self, entries: np.ndarray) -> None:
        """Drop every entry not in `entries` (increasing): the entries whose rows all finished
        leave the cache, so later steps compute nothing for them. Rows' `entry_of` is remapped
        (rows of dropped entries get -1)."""
        entries = np.asarray(entries, dtype=np.int64)
        if len(entries) == self.num_entries:
            return
        self.past.batch_select_indices(torch.from_numpy(entries))
        self.owner, self.prompt_length = self.owner[entries], self.prompt_length[entries]
        self.prompt_hidden = self.prompt_hidden[torch.from_numpy(entries)]
        new_index = np.full(self.num_entries, -1, dtype=np.int64)
        new_index[entries] = np.arange(len(entries))
        self.entry_of = new_index[self.entry_of]
        self.num_entries = len(entries)

    def reserve(self, columns: int) -> None:
        """Make room for `columns` more columns per entry, so that `extend` writes its columns in
        place rather than copying the cache each time (agents/lm/kv_cache.py; generation only)."""
        from ludus.agents.lm.kv_cache import reserve_columns

        reserve_columns(self.past, columns)

    def extend(self, tokens: np.ndarray, owner: np.ndarray, positions: np.ndarray) -> torch.Tensor:
        """Append K columns per entry: tokens [E, K] of the rows in slots `owner` [E, K] (-2 for
        padding), at `positions` [E, K]; returns their hidden states [E, K, H]."""
        mask = self._mask(self.owner, owner)
        prefix = {} if self.prefix is None else {"shared_prefix": self.prefix}
        hidden, self.past = self.model.trunk(torch.from_numpy(tokens), mask, self.past, torch.from_numpy(positions),
                                             use_cache=True, **prefix)
        self.owner = np.concatenate([self.owner, owner], axis=1)
        return hidden


def _split_activated(row: Sequence[int], activated: int) -> tuple[list[int], list[int]]:
    """A prompt's part read by the base alone and its last `activated` tokens (read with the adapters)."""
    if not 0 < activated < len(row):
        raise LMError(f"a prompt of {len(row)} tokens cannot end in {activated} activation tokens: "
                      f"lora.activation_tokens must be shorter than every prompt")
    return list(row[:-activated]), list(row[-activated:])


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Number of leading tokens all rows share."""
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != first[i] for r in rows):
            return i
    return n


# ------------------------------------------------------------------ a trunk cut at a frozen layer


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


@dataclass
class _GenerationBuffers:
    batch: int
    max_new_tokens: int
    pad_id: int
    tokens: np.ndarray = field(init=False)
    lengths: np.ndarray = field(init=False)
    log_probs: np.ndarray = field(init=False)
    values: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = np.full((self.batch, self.max_new_tokens), self.pad_id, dtype=np.int64)
        self.lengths = np.zeros(self.batch, dtype=np.int64)
        self.log_probs = np.zeros((self.batch, self.max_new_tokens), dtype=np.float32)
        self.values = np.zeros((self.batch, self.max_new_tokens), dtype=np.float32)

    def record(self, rows: np.ndarray, step: int, tokens: np.ndarray, log_probs: np.ndarray,
               values: np.ndarray) -> None:
        self.tokens[rows, step] = tokens
        self.log_probs[rows, step] = log_probs
        self.values[rows, step] = values
        self.lengths[rows] = step + 1

    def freeze(self) -> Generation:
        return Generation(self.tokens, self.lengths, self.log_probs, self.values)


def generate_text(lm: LoadedLM, prompts: Sequence[str], max_new_tokens: int, rng: np.random.Generator,
                  greedy: bool = False, chat: bool = True) -> list[str]:
    """Replies of a pretrained LM to text prompts (the text interface of dialogue games).

    `chat`: wrap each prompt as a user turn with the tokenizer's chat template (instruction-tuned
    models such as SmolLM2-Instruct expect it). Generation stops at the tokenizer's EOS token.
    """
    tokenizer = lm.tokenizer
    if tokenizer is None:
        raise LMError("generate_text needs a model loaded with its tokenizer (load_hf_causal_lm)")
    encoded = []
    for prompt in prompts:
        if chat and tokenizer.chat_template is not None:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
        else:
            text = prompt
        encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generation = LMPolicy(lm.model, pad_id=pad).generate(encoded, max_new_tokens, rng,
                                                         stop_token=tokenizer.eos_token_id, greedy=greedy)
    return [tokenizer.decode(generation.row(i), skip_special_tokens=True).strip() for i in range(len(prompts))]


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
