"""Prompts read once: the keys and values of prompts kept by their tokens, and a KV cache in which
rows that share a prompt share its keys and values.

`PromptStore` keeps the prompts read with one set of weights; `BaseReadings` keeps the base
model's readings of the prompts that activated adapters read, for the whole run; `SharedPromptCache`
reads a batch of prompts (each distinct one once, their common prefix once) and packs every row's
own tokens after its prompt. Generation (`ludus.agents.lm.generation`) and the learners' readings
(agents/lm/text_ppo.py, text_mmd.py, text_exit.py) read prompts through it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from ludus.agents.lm.model import LMError, LMWithValueHead
from ludus.agents.lm.pretrained import adapter_disabled

if TYPE_CHECKING:
    from ludus.agents.lm.packed import DecodeStep


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
    afresh. Here every prompt is read in blocks of `block` tokens, each block from its own tokens
    and the keys and values of the blocks before it, and each the same floats at any time and in
    any company (for the process's torch thread count): read with other prompts' blocks by
    `ludus.agents.lm.packed.read_blocks`, whose products give a row the floats it has alone, or
    alone through the model's own forward (always the same shapes). So a resumed run computes
    exactly what was kept. A block is keyed by all the tokens up to its end (as vLLM's
    prefix caching chains its block hashes), so prompts that begin alike (the rules) share theirs,
    and an evicted block is simply read again.

    Tensors are kept out of inference mode, so that a learner's gradient pass can read them."""

    BLOCKS_AT_ONCE = 16
    """Blocks read in one call of `read_blocks` (activations of at most 16 x `block` rows)."""

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
        return self.read_many(model, [prompt])[0]

    def read_many(self, model: "LMWithValueHead", prompts: Sequence[Sequence[int]]
                  ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """`read` of each prompt. The blocks that are not kept are read a prompt's next block at a
        time, those of all the prompts together where the model is of a family that
        `ludus.agents.lm.packed.read_blocks` runs (each block the same floats as alone), else one by
        one through the model's own forward."""
        from ludus.agents.lm.packed import read_blocks, reads_blocks

        keyed = [tuple(int(t) for t in prompt) for prompt in prompts]
        ends = [list(range(self.block, len(tokens), self.block)) + [len(tokens)] for tokens in keyed]
        held: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}  # this call's blocks: the
        # store may evict some of them while others are added
        together = reads_blocks(model)
        for depth in range(max(len(stops) for stops in ends)):
            missing: dict[tuple[int, ...], tuple[tuple[int, ...], int, Any]] = {}
            for tokens, stops in zip(keyed, ends):
                key = tokens[:stops[depth]] if depth < len(stops) else None
                if key is None or key in held or key in missing:
                    continue
                if key in self.blocks:
                    self.blocks.move_to_end(key)
                    held[key] = self.blocks[key]
                    continue
                start = stops[depth - 1] if depth else 0
                before = self._joined([held[tokens[:end]] for end in stops[:depth]]) if depth else None
                missing[key] = (key[start:], start, before)
            keys, step = list(missing), self.BLOCKS_AT_ONCE if together else 1
            for first in range(0, len(keys), step):
                part = keys[first:first + step]
                read = read_blocks(model, [missing[key] for key in part]) if together else \
                    [self._read_block(model, *missing[part[0]])]
                for key, layers in zip(part, read):
                    held[key] = layers
                    self._put(key, layers)
                self.computed += len(part)
        return [self._joined([held[tokens[:end]] for end in stops]) for tokens, stops in zip(keyed, ends)]

    @staticmethod
    def _joined(blocks: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.cat([b[layer][0] for b in blocks], dim=2), torch.cat([b[layer][1] for b in blocks], dim=2))
                for layer in range(len(blocks[0]))]

    @staticmethod
    def _read_block(model: "LMWithValueHead", tokens: tuple[int, ...], start: int,
                    before: list[tuple[torch.Tensor, torch.Tensor]] | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One block after the keys and values `before` it, by the model's own forward."""
        from transformers import DynamicCache

        with torch.inference_mode(False), torch.no_grad():
            cache = None
            if before is not None:
                cache = DynamicCache()
                for layer, (keys, values) in enumerate(before):
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
                 activated: Sequence[int] | None = None, decoder: "DecodeStep | None" = None):
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
                count_of: dict[int, int] = {}
                for d, n in zip(prompt_of.tolist(), activated):
                    if count_of.setdefault(d, int(n)) != n:
                        raise LMError("rows with the same prompt read it with different activation tokens")
                split = [split_activated(distinct[d], count_of[d]) for d in range(len(distinct))]
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
            past, tail_hidden, real = self._read_tails(model, past, real, self.prefix, tails, decoder)
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
        layers = readings.read_many(model, heads)
        shared = cls._shared_length(heads) if prefix_once else 0
        held = [(k[:, :, :shared], v[:, :, :shared]) for k, v in layers[0]] if shared > 0 else None
        cache, real = cls._assemble(layers, skip=shared)
        return cache, None, real, held

    @classmethod
    def _read_tails(cls, model: "LMWithValueHead", past: Any, real: np.ndarray,
                    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None, tails: list[list[int]],
                    decoder: "DecodeStep | None" = None) -> tuple[Any, torch.Tensor, np.ndarray]:
        """Append each prompt's activation tokens (LEFT-padded, so that every prompt still ends in
        the last column) after its base reading `past`, by `decoder` if given (generation) else
        the model's own forward; returns the cache, the tails' hidden states [D, longest tail, H]
        and the real columns."""
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
        if decoder is not None:
            hidden = decoder.trunk(torch.from_numpy(ids), mask, past, torch.from_numpy(positions), prefix)
        else:
            extra = {} if prefix is None else {"shared_prefix": prefix}
            hidden, past = model.trunk(torch.from_numpy(ids), mask, past, torch.from_numpy(positions),
                                       use_cache=True, **extra)
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

    def extend(self, tokens: np.ndarray, owner: np.ndarray, positions: np.ndarray,
               decoder: "DecodeStep | None" = None) -> torch.Tensor:
        """Append K columns per entry: tokens [E, K] of the rows in slots `owner` [E, K] (-2 for
        padding), at `positions` [E, K]; returns their hidden states [E, K, H]. `decoder`: a
        `ludus.agents.lm.packed.DecodeStep` of the model that computes them (else the model's own
        forward)."""
        mask = self._mask(self.owner, owner)
        if decoder is not None:
            hidden = decoder.trunk(torch.from_numpy(tokens), mask, self.past, torch.from_numpy(positions), self.prefix)
        else:
            prefix = {} if self.prefix is None else {"shared_prefix": self.prefix}
            hidden, self.past = self.model.trunk(torch.from_numpy(tokens), mask, self.past,
                                                 torch.from_numpy(positions), use_cache=True, **prefix)
        self.owner = np.concatenate([self.owner, owner], axis=1)
        return hidden


def split_activated(row: Sequence[int], activated: int) -> tuple[list[int], list[int]]:
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
