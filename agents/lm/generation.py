"""Acting and generating with a language model: token sampling, `LMPolicy` and `generate_text`.

Sampling uses the caller's `np.random.Generator`, never torch's global RNG: one uniform number per
(row, new token) and the inverse of the cumulative distribution (token = first index whose
cumulative probability exceeds u). Illegal tokens have probability exactly 0 (their logit is
-1e9, ludus.agents.nets.MASKED_LOGIT), so the cumulative sum is flat across them and they can never be
picked. Because the numbers are drawn per (row, step) up front, batched and per-sample generation
consume them identically and give the same tokens for the same Generator state.

Batched generation reads its prompts through `ludus.agents.lm.prompt_cache.SharedPromptCache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ludus.agents.lm.model import LMError, LMWithValueHead, LoadedLM, as_tensor
from ludus.agents.lm.packed import DecodeStep
from ludus.agents.lm.pretrained import adapter_disabled
from ludus.agents.lm.prompt_cache import BaseReadings, PromptStore, SharedPromptCache, split_activated
from ludus.agents.nets import masked_logits
from ludus.agents.policy import ActBatch, ActOutput


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
        cdf = torch.cumsum(log_pi.exp(), dim=-1, dtype=torch.float64)  # summed in float64
        # u scaled by the total mass (1 up to rounding) so that the count below is at most V-1.
        u = torch.from_numpy(np.asarray(uniforms, dtype=np.float64)) * cdf[:, -1]
        tokens = torch.searchsorted(cdf, u[:, None], right=True).squeeze(1)  # entries <= u
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
            # decode steps (and activated adapters' tokens) on packed weights where the model and
            # host allow (agents/lm/packed.py)
            decoder = DecodeStep(self.model) if DecodeStep.supports(self.model) else None
            cache = SharedPromptCache(self.model, rows, share=reuse_prefix, store=store if reuse_prefix else None,
                                      prefix_once=reuse_prefix, decoder=decoder)
            # every step appends at most one column per row of an entry
            cache.reserve(max_new_tokens * int(np.bincount(cache.entry_of).max()))
            hidden = cache.prompt_hidden[torch.from_numpy(cache.entry_of)]
            live = np.arange(batch)  # rows still generating
            for step in range(max_new_tokens):
                logits, values = (decoder or self.model).heads(hidden)
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
                step_hidden = cache.extend(ids, owner, positions, decoder)
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
                    head = len(split_activated(row, activated)[0])
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
