"""An LM's exact answer distribution at many information states at once.

`response_action_probabilities` (agents/lm/text_policy.py) reads one information state: it
enumerates every response opened with "[" that is still on its way to a legal answer, one token
per step, and re-reads the prompt with each step's frontier. That is fine for Kuhn poker's 12
information states; Leduc poker has 936, and the prompts are most of the work.

`answer_distributions` computes the same numbers for a whole table, in chunks of information
states that go through the model together:

* the prompts are sorted, so that prompts sharing leading tokens (the same seat, the same
  private card) come together, and read in chunks into one `SharedPromptCache` each (their
  common prefix, the system message with the rules, held once: `prefix_once`); a prompt reads only
  its tokens after the longest stem it shares with a prompt of the previous chunk (a
  `PromptStore`, the prefix caching of vLLM and SGLang): on Leduc poker with SmolLM2's tokenizer
  53,534 tokens in chunks of 8 instead of ~150,000 for the 936 prompts one by one (46,448 is the
  number of distinct prefixes, the least any reading can do);
* every response prefix in the frontier (a node of the response tree) then costs one column:
  its last token, read after the prompt and its ancestors' columns in the same cache entry,
  under a 4-D attention mask in which a column sees the prompt, the columns of its ancestors and
  itself (tree attention, as in SpecInfer: Miao et al. 2024, "SpecInfer: accelerating LLM
  serving with tree-based speculative inference"), with the position ids it would have alone;
* tokens outside the candidate set of each state's answers (`_answer_tokens`) and prefixes rarer
  than `PROBABILITY_FLOOR` are never expanded, exactly as in `response_action_probabilities`.

So each node is computed exactly as the unbatched reading computes it, up to float rounding of
the batched matrix products (tests/test_lm_exploitability.py checks the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ludus.agents.lm.prompt_cache import PromptStore
from ludus.agents.policy import ActBatch
from ludus.bounds import bounds


@dataclass(frozen=True)
class AnswerTableConfig:
    """How `answer_distributions` batches a table of information states."""

    chunk: int = field(default=8, metadata=bounds(1, 4096))
    """Information states read through the model together (memory grows with it: about one prompt's
    keys and values per state, ~4 MB for SmolLM2-135M's ~90 tokens after the shared rules)."""
    store_mb: float = field(default=512.0, metadata=bounds(1, 1e6))
    """Megabytes of prompt readings kept from one chunk to the next (`PromptStore`): enough for a
    chunk's prompts (SmolLM2-135M in fp32: ~7 MB per 160-token Leduc prompt)."""
    first_token: bool = False
    """Read only the first token of the response: an action's probability is the mass of the
    tokens that begin its answers and no other's (`answer_start_tokens`), the rest is invalid. One
    pass over the prompts, no response tree; an upper bound on each action's exact probability
    (a response may still go astray after its first token), equal to it when every response that
    starts an answer finishes it."""

    def __post_init__(self) -> None:
        if not 1 <= self.chunk <= 4096:
            from ludus.agents.lm.model import LMError

            raise LMError(f"answer table chunk must be in 1..4096, got {self.chunk}")


@dataclass
class _Node:
    """A response prefix on its way to an answer."""

    row: int
    """The distinct prompt it continues (index into the chunk)."""
    path: tuple[int, ...]
    text: str
    mass: float
    column: int = -1
    """Its id in the cache's owner array once read (its last token's column)."""
    ancestors: tuple[int, ...] = ()
    """Ids of the columns of its earlier tokens."""


def answer_distributions(policy, obs: np.ndarray, seats: np.ndarray, masks: np.ndarray,
                         config: AnswerTableConfig = AnswerTableConfig()) -> tuple[np.ndarray, np.ndarray]:
    """([N, A] probability that one response names each legal action, [N] the rest: the invalid
    mass) of a `TextLMPolicy` whose responses are opened with "[", at N (observation, seat,
    legal mask) rows: `response_action_probabilities` of every row, batched (module docstring)."""
    from ludus.agents.lm.text_policy import _answer_tokens

    masks = np.asarray(masks, dtype=bool)
    n = len(masks)
    probs = np.zeros(masks.shape, dtype=np.float64)
    if n == 0:
        return probs, np.zeros(0)
    policy.activate()
    # identical prompts (and answers) are read once
    keys: dict[tuple, int] = {}
    row_of = np.zeros(n, dtype=np.int64)
    distinct: list[tuple[list[int], dict[str, int]]] = []
    for i in range(n):
        answers = dict(policy.view.answers(obs[i], int(seats[i]), masks[i]))
        prompt = policy.encode(obs[i], int(seats[i]), masks[i])
        key = (tuple(prompt), tuple(sorted(answers.items())))
        if key not in keys:
            keys[key] = len(distinct)
            distinct.append((list(prompt), answers))
        row_of[i] = keys[key]
    order = sorted(range(len(distinct)), key=lambda d: distinct[d][0])
    found = np.zeros((len(distinct), masks.shape[1]), dtype=np.float64)
    # the prompts read so far (the most recent ones): a prompt then reads only its tokens after the
    # longest stem it shares with one of them, the previous chunk's in sorted order (activated
    # adapters keep the base's readings instead: `TextLMPolicy.readings`)
    store = policy.readings() if policy.model.activation_tokens else PromptStore(config.store_mb)
    for start in range(0, len(order), config.chunk):
        members = order[start:start + config.chunk]
        prompts = [distinct[d][0] for d in members]
        answers = [distinct[d][1] for d in members]
        candidates = [_answer_tokens(policy.tokenizer, list(a)) for a in answers]
        found[members] = _read_chunk(policy, prompts, answers, candidates, masks.shape[1], store, config.first_token)
    probs[:] = found[row_of]
    return probs, np.clip(1.0 - probs.sum(axis=1), 0.0, None)


def _read_chunk(policy, prompts: list[list[int]], answers: list[dict[str, int]],
                candidates: list[tuple[np.ndarray, list[str]]], num_actions: int, store, first_token: bool = False
                ) -> np.ndarray:
    """[len(prompts), num_actions] answer probabilities of one chunk (`answer_distributions`)."""
    from ludus.agents.lm.prompt_cache import SharedPromptCache
    from ludus.agents.lm.text_policy import PROBABILITY_FLOOR, answer_start_tokens
    from ludus.games.text import normal_answer

    model, play = policy.model, policy.play
    probs = np.zeros((len(prompts), num_actions), dtype=np.float64)
    with torch.inference_mode():
        cache = SharedPromptCache(model, prompts, store=store, prefix_once=True)
        hidden = cache.prompt_hidden[torch.from_numpy(cache.entry_of)]  # [rows, H]
        owner = cache.owner.copy()  # [entries, columns]: -1 prompt, -2 padding, >= 0 a node's column id
        frontier = [_Node(row, (), "", 1.0) for row in range(len(prompts))]
        next_id = 0
        for step in range(play.max_new_tokens):
            if not frontier:
                break
            logits, _ = model.heads(hidden)
            log_pi = torch.log_softmax(logits.float() / play.temperature, dim=-1)
            if first_token:
                for row, words in enumerate(answers):
                    actions = sorted(set(words.values()))
                    for action, ids in zip(actions, answer_start_tokens(policy.tokenizer, words)):
                        probs[row, action] = float(log_pi[row, torch.from_numpy(ids)].exp().double().sum())
                break
            grown: list[_Node] = []
            last_step = step + 1 == play.max_new_tokens
            for k, node in enumerate(frontier):
                ids, texts = candidates[node.row]
                row = log_pi[k, torch.from_numpy(ids)].exp().double().numpy()
                words = answers[node.row]
                for j in np.flatnonzero(row * node.mass >= PROBABILITY_FLOOR).tolist():
                    token, p = int(ids[j]), float(row[j])
                    text = node.text + texts[j]
                    if "]" in text:
                        inside = text[: text.index("]")]
                        if "[" not in inside and normal_answer(inside) in words:
                            probs[node.row, words[normal_answer(inside)]] += node.mass * p
                        continue
                    core = normal_answer(text)
                    if not last_step and core and any(w.startswith(core) for w in words) and not text.endswith("\n"):
                        ancestors = node.ancestors + ((node.column,) if node.column >= 0 else ())
                        grown.append(_Node(node.row, node.path + (token,), text, node.mass * p, ancestors=ancestors))
            frontier = grown
            if not frontier:
                break
            # drop the entries whose responses are all decided
            entry_rows = cache.entry_of
            kept = np.unique(entry_rows[[node.row for node in frontier]])
            if len(kept) != cache.num_entries:
                owner = owner[kept]
                cache.keep_entries(kept)
            entries = cache.entry_of[[node.row for node in frontier]]
            width = int(np.bincount(entries, minlength=cache.num_entries).max())
            ids = np.zeros((cache.num_entries, width), dtype=np.int64)
            new_owner = np.full((cache.num_entries, width), -2, dtype=np.int64)
            positions = np.zeros((cache.num_entries, width), dtype=np.int64)
            depth = max(len(node.ancestors) for node in frontier) + 1
            lineage = np.full((cache.num_entries, width, depth), -3, dtype=np.int64)  # ids a column sees
            columns = np.zeros(len(frontier), dtype=np.int64)
            fill = np.zeros(cache.num_entries, dtype=np.int64)
            for k, node in enumerate(frontier):
                e = entries[k]
                c = columns[k] = fill[e]
                fill[e] += 1
                node.column, next_id = next_id, next_id + 1
                ids[e, c], new_owner[e, c] = node.path[-1], node.column
                positions[e, c] = cache.prompt_length[e] + len(node.path) - 1
                lineage[e, c, :len(node.ancestors) + 1] = node.ancestors + (node.column,)
            mask = _tree_mask(owner, new_owner, lineage)
            extra = {} if cache.prefix is None else {"shared_prefix": cache.prefix}
            step_hidden, cache.past = model.trunk(torch.from_numpy(ids), mask, cache.past,
                                                  torch.from_numpy(positions), use_cache=True, **extra)
            owner = np.concatenate([owner, new_owner], axis=1)
            hidden = step_hidden[torch.from_numpy(entries), torch.from_numpy(columns)]
    return probs


def _tree_mask(old_owner: np.ndarray, new_owner: np.ndarray, lineage: np.ndarray) -> torch.Tensor:
    """[E, 1, K, old + K] bool: a new column sees the prompt's columns and the columns whose ids are
    in its lineage (its ancestors and itself); padding sees itself only (no empty softmax row)."""
    owners = np.concatenate([old_owner, new_owner], axis=1)  # [E, C]
    sees = (owners[:, None, :] == -1) | (owners[:, None, :, None] == lineage[:, :, None, :]).any(axis=-1)
    pad = new_owner == -2
    k_index = np.arange(owners.shape[1])[None, None, :]
    q_index = (old_owner.shape[1] + np.arange(new_owner.shape[1]))[None, :, None]
    sees |= (k_index == q_index) & pad[:, :, None]
    return torch.from_numpy(sees[:, None])


def exact_action_probabilities(policy, batch: ActBatch, config: AnswerTableConfig = AnswerTableConfig()) -> np.ndarray:
    """[N, A] action distribution of a `TextLMPolicy` (responses opened with "[") AS IT PLAYS at
    each row: `answer_distributions`, then retries and the random fallback (`played_distribution`)."""
    from ludus.agents.lm.text_policy import played_distribution

    masks = np.asarray(batch.mask, dtype=bool)
    response, invalid = answer_distributions(policy, np.asarray(batch.obs), np.asarray(batch.seats), masks, config)
    return np.stack([played_distribution(response[i], float(invalid[i]), masks[i], policy.play.invalid.retries)
                     for i in range(len(masks))]) if len(masks) else np.zeros(masks.shape)
