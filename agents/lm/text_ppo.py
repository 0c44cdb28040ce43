"""Turn-level PPO for a pretrained LM playing text games (pure compute: `TextPPOLearner.update`).

One row of a `TurnBatch` is one turn: the prompt the LM read and the response it wrote (its
first response of the turn, agents/lm/text_policy.py), the behaviour log-prob of every response
token, and the turn's return (the seat's final game result; -penalty when the response did not
count). The advantage of a turn is its return minus a baseline, the same for every token of the
response: the value head at the prompt, a role-conditioned running mean as SPIRAL's (Liu et al.
2025, arXiv 2506.24119, §3.3: RAE, one per game seat, because the first and second player of a
zero-sum game have different expected returns), or the mean of the batch's other turns with the
same prompt (GRPO's group baseline) — `TextPPOConfig.baseline`. An optional entropy bonus on the
answer at the response's first token keeps every answer sampled; optionally (`all_actions`) that
token is trained on every legal answer at once, weighted by each answer's mean return at the
position in the batch, where the batch gave more than one answer there. The loss per response token is PPO's clipped surrogate (agents/ppo_core.py;
the ratio is to the behaviour log-probs, so rows played by an older policy version in async mode
are corrected by importance sampling) plus a KL penalty to the base model, which is the same
network with its LoRA adapters switched off (agents/lm/pretrained.py), estimated per token with
Schulman's k3 estimator (exp(ref - logp) - (ref - logp) - 1: unbiased and always >= 0, as
GRPO uses it).

Every prompt of a batch starts with the same chat header and rules, and many turns ask the same
position. Prompts are read as generation reads them (agents/lm/prompt_cache.py `SharedPromptCache`): the
common prefix and each distinct prompt once per micro-batch, each row's response packed after its
prompt with a mask that lets it see only its prompt and itself. Gradients flow back through the
shared prompt exactly as if each row had its own copy. Turns that wrote the same response to the
same prompt (in Kuhn poker most of a batch: 12 positions, a few answers each) are read once
(`distinct_turns`) and their readings handed to every such row, so a step costs the distinct
turns, not all of them. Micro-batches accumulate gradients into one optimizer step per minibatch
(`TorchAdam.apply`), so memory is bounded by `micro_batch_size`. With adapters in the top layers
only (`LoRAConfig.layers`), the reference and the policy are the same function below them: those
layers are read once per micro-batch for both (`SplitTrunk`). With activated adapters
(`LoRAConfig.activation_tokens`), a prompt up to its activation tokens is the base's, read once per
run for the runners and the learner alike (agents/lm/prompt_cache.py `BaseReadings`), and only the activation
tokens and the response are read with gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Sequence

import numpy as np
import torch

from ludus.agents.lm.model import LMWithValueHead
from ludus.agents.lm.prompt_cache import BaseReadings, PromptStore, SharedPromptCache, base_readings
from ludus.agents.lm.split_trunk import SplitTrunk, frozen_lower_layers
from ludus.agents.ppo_core import StatMeans, TorchAdam, categorical_entropy, k3, padded, ppo_terms
from ludus.agents.lm.pretrained import adapter_disabled, adapter_parameters
from ludus.bounds import bounds


@dataclass(frozen=True)
class TextPPOConfig:
    """Turn-level PPO on the LM's own response tokens."""

    learning_rate: float = field(default=2e-4, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the LoRA adapters (adapters tolerate ~10x the full-model rate)."""
    clip_coef: float = field(default=0.2, metadata=bounds(0, 1, low_open=True))
    """PPO's surrogate clipping epsilon."""
    kl_coef: float = field(default=0.02, metadata=bounds(0, 100))
    """Weight of the per-token KL penalty to the base model (adapters off)."""
    baseline: Literal["rae", "value", "prompt"] = "value"
    """What a turn's return is compared with: 'rae', one running mean per seat (SPIRAL's role-conditioned
    advantage), 'value', the value head at the turn's prompt (a baseline per position), or 'prompt', the
    mean return of the batch's OTHER turns asked the same prompt (GRPO's group baseline, Shao et al.
    2024, with the turn left out so that it stays unbiased; a prompt asked once falls back to its seat's
    RAE baseline). In a game whose positions recur (Kuhn poker's 12 information states) the advantages
    of one prompt then sum to about zero: nothing pushes every prompt towards one answer."""
    rae_decay: float = field(default=0.95, metadata=bounds(0, 1, high_open=True))
    """Role baselines follow b <- decay * b + (1 - decay) * mean return of the role's turns (SPIRAL: 0.95).
    They start at 0, which suits zero-sum returns; where returns average well above 0 and a run makes few
    updates, a lower decay lets them catch up (the negotiation preset's 0.5, docs/llm.md)."""
    answer_entropy_coef: float = field(default=0.0, metadata=bounds(0, 100))
    """Weight of an entropy bonus on the LM's answer distribution at a response's first token (tokens
    grouped by the legal answer they begin, `ludus.agents.lm.text_policy.answer_start_tokens`, renormalised over
    the answers). Every prompt of a game differs from the others in a few words, so an update that
    favours one answer moves all of them; without a bonus the policy can settle on one answer at every
    position before the position-specific advantages (fold the Jack, call with the King) have been
    sampled often enough to separate them. An entropy over the whole vocabulary would instead reward
    text that is no answer. 0 disables it."""
    all_actions: bool = False
    """All-action policy gradient on the answer (Sutton et al. 2000; Allen et al. 2017, Mean Actor-Critic):
    at a prompt where the batch sampled two or more different legal answers, the response's first token
    is trained on every answer at once, loss -sum_a q(a) (Q(a) - sum_b q(b) Q(b)), with q the answer
    distribution at that token (the answer-start token groups, renormalised, as the entropy bonus reads
    it) and Q(a) the batch's mean return of the turns that gave answer a to this prompt (an answer the
    batch never gave there counts as average). The sampled surrogate still trains the rest of those
    responses and every turn whose prompt the batch asked with one answer only. A sampled turn says only
    whether its own answer beat the baseline, with the whole game's noise on it; the batch's table says
    how every answer did at the position, so where positions recur (Kuhn poker's 12 information states,
    each asked ~25 times in 128 matches) the answer's gradient is close to the exact one."""
    value_learning_rate: float = field(default=3e-3, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the value head (baseline 'value'), which has its own optimizer: see `value_steps`."""
    value_steps: int = field(default=16, metadata=bounds(0, 10**6))
    """Full-batch Adam steps on the value head per update (baseline 'value'). The head is a linear probe on
    the prompt's last hidden state, whose features are read by the policy's forward pass anyway, so
    fitting it costs almost nothing; one shared step per update (as in the policy's optimizer) left it
    far from the returns, and its gradient, clipped together with the adapters', shrank theirs."""
    epochs: int = field(default=1, metadata=bounds(1, 1000))
    """Passes over a batch of turns."""
    minibatch_size: int = field(default=64, metadata=bounds(1, 10**6))
    """Turns per optimizer step."""
    micro_batch_size: int = field(default=16, metadata=bounds(1, 10**6))
    """Turns per forward/backward pass; gradients of a minibatch's micro-batches accumulate."""
    max_grad_norm: float = field(default=1.0, metadata=bounds(0, None, low_open=True))
    """Global gradient-norm clip."""
    adam_eps: float = field(default=1e-8, metadata=bounds(0, 1, low_open=True))
    """Adam epsilon."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.rae_decay < 1.0:
            raise ValueError(f"rae_decay must be in [0, 1), got {self.rae_decay}")
        if self.micro_batch_size < 1 or self.minibatch_size < self.micro_batch_size:
            raise ValueError(f"need 1 <= micro_batch_size <= minibatch_size, got {self.micro_batch_size} and "
                             f"{self.minibatch_size}")
        if self.epochs < 1 or self.learning_rate <= 0 or self.value_learning_rate <= 0:
            raise ValueError("epochs must be >= 1 and learning rates > 0")
        if self.value_steps < 0:
            raise ValueError(f"value_steps must be >= 0, got {self.value_steps}")


@dataclass(frozen=True)
class TurnBatch:
    """Turns to train on, one row each."""

    prompts: tuple[tuple[int, ...], ...]
    """Token ids the LM read (chat template and any response prefix included)."""
    responses: tuple[tuple[int, ...], ...]
    """Token ids it wrote (at least one each)."""
    behaviour_log_probs: tuple[np.ndarray, ...]
    """Per response token, its log-prob under the policy that wrote it."""
    returns: np.ndarray
    """[N] the turn's return."""
    roles: np.ndarray
    """[N] int seat of the turn (the RAE baseline it is compared with)."""
    values: np.ndarray | None = None
    """[N] the value head's estimate at the turn's prompt when it was played (baseline 'value')."""
    answer_tokens: tuple[tuple[np.ndarray, ...], ...] | None = None
    """Per turn, per legal action, the token ids a response can begin that answer with
    (`ludus.agents.lm.text_policy.answer_start_tokens`; needed when answer_entropy_coef > 0 or all_actions)."""
    answers: np.ndarray | None = None
    """[N] int: which of the turn's legal actions (their index in increasing id order, as in
    `answer_tokens`) its response named, -1 when it named none (needed when all_actions)."""

    def __len__(self) -> int:
        return len(self.prompts)


def prompt_advantages(returns: np.ndarray, prompts: Sequence[Sequence[int]], fallback: np.ndarray) -> np.ndarray:
    """Advantage = return - the mean return of the other turns with the same prompt (leave-one-out
    group baseline); `fallback` [N] is the baseline of a turn whose prompt no other turn has."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(i)
    baseline = np.asarray(fallback, dtype=np.float64).copy()
    for rows in groups.values():
        if len(rows) > 1:
            total = returns[rows].sum()
            baseline[rows] = (total - returns[rows]) / (len(rows) - 1)
    return (returns - baseline).astype(np.float32)


def role_advantages(returns: np.ndarray, roles: np.ndarray, baselines: np.ndarray, decay: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """RAE (SPIRAL, Algorithm 1): advantage = return - the role's baseline before this batch;
    then each role's baseline moves towards the mean return of its turns in the batch.
    Returns (advantages, new baselines)."""
    advantages = (returns - baselines[roles]).astype(np.float32)
    updated = baselines.copy()
    for role in np.unique(roles):
        updated[role] = decay * baselines[role] + (1 - decay) * float(returns[roles == role].mean())
    return advantages, updated


class ResponseReading(NamedTuple):
    """What `response_log_probs` reads. W is the longest response; response tokens are
    left-aligned, `mask` marks the real ones."""

    log_probs: torch.Tensor
    """[B, W] log-prob of each response token."""
    entropies: torch.Tensor
    """[B, W] entropy of the distribution each token was drawn from."""
    mask: torch.Tensor
    """[B, W] bool."""
    features: torch.Tensor
    """[B, H] the prompt's last hidden state (what the value head reads), detached."""
    first_log_pi: torch.Tensor
    """[B, V] the distribution of the response's first token."""


def response_log_probs(model: LMWithValueHead | Any, prompts: Sequence[Sequence[int]],
                       responses: Sequence[Sequence[int]], temperature: float,
                       store: PromptStore | BaseReadings | None = None
                       ) -> ResponseReading:
    """Log-probs of each response token given its prompt, and the entropy of each of those
    distributions, under softmax(logits / temperature), and each prompt's last hidden state (what
    the value head reads, detached); gradients flow when enabled.

    Read as generation reads them (`SharedPromptCache`): the common prefix and each distinct
    prompt once, each row's response packed after its prompt, attending to it and to itself.
    `store` (no gradients): prompts read before with the same weights. `model` may be a part of
    a cut trunk (agents/lm/split_trunk.py `SplitTrunk.above`)."""
    hidden, tokens, lengths = read_responses(model, prompts, responses, store)
    width = tokens.shape[1]
    first = hidden[:, :1]
    logits, _ = model.heads(hidden)
    log_pi = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = log_pi.gather(-1, torch.from_numpy(tokens)[..., None]).squeeze(-1)
    mask_np = np.arange(width)[None, :] < lengths[:, None]
    # the value head reads the prompt's last hidden state without moving the trunk: a linear probe,
    # so that fitting the baseline never pulls on the adapters that write the text
    return ResponseReading(chosen, categorical_entropy(log_pi), torch.from_numpy(mask_np), first[:, 0].detach(),
                           log_pi[:, 0])


def read_responses(model: LMWithValueHead | Any, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                   store: PromptStore | BaseReadings | None = None) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The trunk's hidden state [B, W, H] from which each response token is predicted (the
    prompt's last one for the first token), the responses right-padded [B, W] and their lengths
    [B]: the trunk calls of `response_log_probs`, without the heads."""
    batch = len(prompts)
    lengths = np.array([len(r) for r in responses])
    width = int(lengths.max())
    tokens = np.zeros((batch, width), dtype=np.int64)
    for i, r in enumerate(responses):
        tokens[i, :len(r)] = r
    activated = int(getattr(model, "activation_tokens", 0))
    if activated and lengths.min() >= 1:
        joined = [list(p) + list(r[:-1]) for p, r in zip(prompts, responses)]
        if len({tuple(j) for j in joined}) == batch:
            return _read_responses_as_tails(model, joined, tokens, lengths, activated, store)
    # activated adapters: the prompts' common prefix (the base's, without gradients) is held once and
    # read by every row's queries together, as generation reads it (agents/lm/kv_cache.py)
    cache = SharedPromptCache(model, [list(p) for p in prompts], store=store,
                              prefix_once=bool(getattr(model, "activation_tokens", 0)))
    # response tokens 0..len-2 of each row are read to predict tokens 1..len-1; token 0 is
    # predicted from the prompt's last hidden state
    reads = lengths - 1
    start = np.zeros(batch, dtype=np.int64)
    for entry in range(cache.num_entries):
        rows = np.flatnonzero(cache.entry_of == entry)
        start[rows] = np.concatenate([[0], np.cumsum(reads[rows])[:-1]])
    columns = int(max(1, max(start[cache.entry_of == e].max() + reads[cache.entry_of == e].max()
                             for e in range(cache.num_entries))))
    ids = np.zeros((cache.num_entries, columns), dtype=np.int64)
    owner = np.full((cache.num_entries, columns), -2, dtype=np.int64)
    positions = np.zeros((cache.num_entries, columns), dtype=np.int64)
    for i in range(batch):
        e, cols = cache.entry_of[i], start[i] + np.arange(reads[i])
        ids[e, cols] = tokens[i, :reads[i]]
        owner[e, cols] = cache.slot_of[i]
        positions[e, cols] = cache.prompt_length[e] + np.arange(reads[i])
    read = cache.extend(ids, owner, positions) if reads.max() > 0 else None
    first = cache.prompt_hidden[torch.from_numpy(cache.entry_of)][:, None]
    if read is not None and width > 1:
        rows = np.repeat(np.arange(batch), width - 1)
        cols = (start[:, None] + np.arange(width - 1)[None, :]).clip(max=columns - 1).reshape(-1)
        rest = read[torch.from_numpy(cache.entry_of[rows]), torch.from_numpy(cols)].reshape(batch, width - 1, -1)
        hidden = torch.cat([first, rest], dim=1)
    else:
        hidden = first
    return hidden, tokens, lengths


def _read_responses_as_tails(model: LMWithValueHead | Any, joined: Sequence[Sequence[int]], tokens: np.ndarray,
                             lengths: np.ndarray, activated: int, store: PromptStore | BaseReadings | None
                             ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """`read_responses` for activated adapters when every row's prompt followed by its response but
    the last token (`joined`) is its own: those tokens after the prompt join its activation tokens,
    and the adapters read both in one trunk call instead of two (the activation tokens, then the
    responses after them: ~20% of a tic-tac-toe `text_exit` step here). The base's readings are
    the same, as the part before the activation tokens is the prompt's. `tokens` [B, W] and
    `lengths` [B]: the responses as `read_responses` pads them."""
    batch, width = tokens.shape
    cache = SharedPromptCache(model, joined, store=store, prefix_once=True,
                              activated=[activated + n - 1 for n in lengths.tolist()])
    tails = cache.tail_hidden[torch.from_numpy(cache.entry_of)]  # [B, T, H], LEFT-padded
    # token t of a row of n is predicted from column T - n + t (t = 0: the prompt's last token)
    columns = (tails.shape[1] - lengths[:, None] + np.arange(width)[None, :]).clip(max=tails.shape[1] - 1)
    hidden = tails[torch.arange(batch)[:, None], torch.from_numpy(columns)]
    return hidden, tokens, lengths


def distinct_turns(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
                   ) -> tuple[list[Sequence[int]], list[Sequence[int]], torch.Tensor]:
    """The distinct (prompt, response) pairs among the rows, in first-seen order, and for each
    row the index of its pair: reading the pairs and indexing by it gives every row's reading
    (log-probs, entropies, features; gradients add up over a pair's rows through the index)."""
    index: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    of_row = [index.setdefault((tuple(p), tuple(r)), len(index)) for p, r in zip(prompts, responses)]
    pairs = list(index)
    return [p for p, _ in pairs], [r for _, r in pairs], torch.tensor(of_row, dtype=torch.long)


def answer_masses(first_log_pi: torch.Tensor, answer_tokens: Sequence[np.ndarray]) -> torch.Tensor:
    """[A] log of each answer's first-token mass under the whole vocabulary's distribution (not
    renormalised: the rest of the mass is on text that names no legal move); every group non-empty."""
    return torch.stack([torch.logsumexp(first_log_pi[torch.from_numpy(group)], dim=0) for group in answer_tokens])


def answer_log_probs(first_log_pi: torch.Tensor, answer_tokens: Sequence[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
    """One turn's answer distribution at the first response token, as log-probs: the mass of each
    legal answer's opening tokens, renormalised over the answers that have any; and which answers
    (indices into `answer_tokens`) those are."""
    present = [k for k, g in enumerate(answer_tokens) if len(g)]
    mass = answer_masses(first_log_pi, [answer_tokens[k] for k in present])
    return torch.log_softmax(mass, dim=0), present


def answer_entropies(first_log_pi: torch.Tensor, answer_tokens: Sequence[Sequence[np.ndarray]]) -> torch.Tensor:
    """[B] entropy of each row's answer distribution at the first response token (`answer_log_probs`)."""
    out = []
    for row, groups in zip(first_log_pi, answer_tokens):
        log_q, _ = answer_log_probs(row, groups)
        out.append(-(log_q.exp() * log_q).sum())
    return torch.stack(out)


def answer_values(prompts: Sequence[Sequence[int]], answers: np.ndarray, returns: np.ndarray, num_answers: Sequence[int]
                  ) -> list[np.ndarray | None]:
    """Per turn, the mean return of the batch's turns with its prompt for each legal answer (NaN for an
    answer none of them gave), or None when they gave fewer than two different answers."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        if answers[i] >= 0:
            groups.setdefault(tuple(prompt), []).append(i)
    out: list[np.ndarray | None] = [None] * len(prompts)
    for rows in groups.values():
        given = answers[rows]
        if len(np.unique(given)) < 2:
            continue
        sums = np.bincount(given, weights=returns[rows], minlength=num_answers[rows[0]])
        counts = np.bincount(given, minlength=num_answers[rows[0]])
        values = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        for i in rows:
            out[i] = values
    return out


def all_action_loss(first_log_pi: torch.Tensor, answer_tokens: Sequence[np.ndarray], values: np.ndarray
                    ) -> torch.Tensor:
    """-sum_a q(a) (Q(a) - V) for one turn: q its answer distribution at the first response token
    (each answer's opening tokens' mass, renormalised over the answers), Q `values` (NaN: not
    estimated, counted as V), V = sum_a q(a) Q(a) under the detached q over the estimated answers."""
    log_q, present = answer_log_probs(first_log_pi, answer_tokens)
    q = log_q.exp()
    estimated = torch.from_numpy(~np.isnan(values[present]))
    q_values = torch.from_numpy(np.nan_to_num(values[present])).float()
    weights = q.detach() * estimated
    baseline = (weights * q_values).sum() / weights.sum().clamp(min=1e-12)
    advantage = torch.where(estimated, q_values - baseline, torch.zeros_like(q_values))
    return -(q * advantage).sum()


class TextPPOLearner:
    """Turn-level PPO with role baselines and a KL penalty to the adapter-free base."""

    def __init__(self, model: LMWithValueHead, config: TextPPOConfig, temperature: float, num_roles: int, seed: int,
                 backend_config: Any = None):
        """`backend_config`: a `LearnerBackendConfig` (or a league's `learner_backend`) choosing
        torch Adam (default) or a DeepSpeed engine for the adapters."""
        from ludus.agents.deepspeed_backend import LearnerBackendConfig, make_text_update_backend

        self.model, self.config, self.temperature = model, config, temperature
        adapters = adapter_parameters(model)
        self.backend = make_text_update_backend(model, adapters, config, backend_config or LearnerBackendConfig())
        self.value_backend = TorchAdam(model.value_head.parameters(), config.value_learning_rate, config.adam_eps,
                                       max_grad_norm=float("inf"), fused=False)
        self.baselines = np.zeros(num_roles, dtype=np.float64)
        # the base's readings of the prompts an update repeats (Kuhn poker's twelve positions; with
        # activated adapters, `base_readings` instead)
        self.reference_prompts = PromptStore(capacity_mb=512)
        # below the lowest adapted layer, the reference and the policy are the same function (with
        # activated adapters, the prompts before their activation tokens: `base_readings`)
        frozen = frozen_lower_layers(model)
        self.frozen_layers = (frozen if 0 < frozen < len(model.lm.base_model.layers) and not model.activation_tokens
                              else 0)
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def update(self, batch: TurnBatch) -> dict[str, float]:
        config = self.config
        # prompts are kept within an update only: an update's floats then depend on its batch
        # alone, as after a resume (a kept reading equals a fresh one only up to rounding)
        self.reference_prompts.clear()
        # Returns are game results (bounded by the game's utilities), so advantages are used as
        # they are: dividing by their spread would blow up a batch whose turns all scored alike.
        if config.baseline == "value":
            if batch.values is None:
                raise ValueError("baseline 'value' needs the turns' behaviour values (TurnBatch.values)")
            advantages = (batch.returns - batch.values).astype(np.float32)
        else:
            role_baselines = self.baselines[batch.roles]
            advantages, self.baselines = role_advantages(batch.returns, batch.roles, self.baselines,
                                                         config.rae_decay)
            if config.baseline == "prompt":
                advantages = prompt_advantages(batch.returns, batch.prompts, fallback=role_baselines)
        action_values: list[np.ndarray | None] = [None] * len(batch)
        if config.all_actions:
            if batch.answers is None or batch.answer_tokens is None:
                raise ValueError("all_actions needs the turns' answers and answer tokens (TurnBatch.answers, "
                                 "TurnBatch.answer_tokens)")
            action_values = answer_values(batch.prompts, batch.answers, batch.returns,
                                          [len(t) for t in batch.answer_tokens])
        means, grad_norms = StatMeans(), []
        features = [None] * len(batch)
        self.model.train()
        for _ in range(config.epochs):
            order = self.rng.permutation(len(batch))
            for start in range(0, len(batch), config.minibatch_size):
                rows = order[start:start + config.minibatch_size]
                tokens_in_minibatch = sum(len(batch.responses[i]) for i in rows)
                for micro in range(0, len(rows), config.micro_batch_size):
                    micro_rows = rows[micro:micro + config.micro_batch_size]
                    step_stats, micro_features = self._micro_step(batch, micro_rows, advantages, action_values,
                                                                  tokens_in_minibatch)
                    means.add(step_stats)
                    for k, i in enumerate(micro_rows):
                        features[i] = micro_features[k]
                grad_norms.append(self.backend.apply())
        self.model.eval()
        stats = means.means()
        if config.baseline == "value":
            stats.update(self._fit_values(torch.stack(features), batch.returns))
        self.updates += 1
        if config.all_actions:
            stats["all_action_turns"] = float(np.mean([v is not None for v in action_values]))
        stats.update({"grad_norm": float(np.mean(grad_norms)), "mean_return": float(batch.returns.mean()), "turns": float(len(batch)),
                      "response_tokens": float(np.mean([len(r) for r in batch.responses]))})
        stats.update({f"rae_baseline_seat{r}": float(b) for r, b in enumerate(self.baselines)})
        return stats

    def _fit_values(self, features: torch.Tensor, returns: np.ndarray) -> dict[str, float]:
        """`value_steps` full-batch Adam steps of the value head towards the turns' returns, on the
        prompt features of the policy's last pass (detached: the adapters do not move)."""
        target = torch.from_numpy(returns).float()

        def loss() -> torch.Tensor:
            return 0.5 * ((self.model.values(features) - target) ** 2).mean()

        with torch.no_grad():
            before = float(loss())
        for _ in range(self.config.value_steps):
            self.value_backend.step(loss())
        with torch.no_grad():
            after = float(loss())
        return {"value_loss": before, "value_loss_after_fit": after}

    def _micro_step(self, batch: TurnBatch, rows: np.ndarray, advantages: np.ndarray,
                    action_values: Sequence[np.ndarray | None], tokens_in_minibatch: int
                    ) -> tuple[dict[str, float], torch.Tensor]:
        prompts, responses, pair_of_row = distinct_turns([batch.prompts[i] for i in rows],
                                                         [batch.responses[i] for i in rows])
        policy_store = None
        if self.frozen_layers:
            # adapters in the top layers only: the layers below are read once for both readings
            trunk = SplitTrunk(self.model, self.frozen_layers)
            read_responses(trunk.below(), prompts, responses)
            policy_model, reference_model, store = trunk.above(), trunk.above(), None
        elif self.model.activation_tokens:
            # activated adapters: both readings continue the base's readings of the prompts, kept for
            # the run and shared with the runners in this process (agents/lm/prompt_cache.py `BaseReadings`)
            policy_model, reference_model, store = self.model, self.model, base_readings(self.model)
            policy_store = store
        else:
            policy_model, reference_model, store = self.model, self.model, self.reference_prompts
        with torch.no_grad(), adapter_disabled(self.model):
            reference = response_log_probs(reference_model, prompts, responses, self.temperature,
                                           store=store).log_probs[pair_of_row]
        reading = response_log_probs(policy_model, prompts, responses, self.temperature, store=policy_store)
        log_probs, entropy, mask, features, first_log_pi = (part[pair_of_row] for part in reading)
        width = log_probs.shape[1]
        behaviour = padded((batch.behaviour_log_probs[i] for i in rows), width)
        adv = torch.from_numpy(advantages[rows])[:, None].repeat(1, width)
        all_action = [k for k, i in enumerate(rows) if action_values[i] is not None]
        # the answer at those turns' first token is trained on every answer below, not on the sampled one
        adv[all_action, 0] = 0.0
        weights = mask.float()
        zeros = torch.zeros_like(log_probs)
        terms = ppo_terms(log_probs, behaviour, adv, entropy, zeros, zeros, zeros, self.config.clip_coef,
                          value_clip=None, weights=weights)
        kl = k3(torch.where(mask, reference - log_probs, zeros)) * weights
        # token-mean over the whole minibatch: each micro-batch adds its share of the tokens
        share = float(weights.sum()) / tokens_in_minibatch
        loss = terms.policy_loss + self.config.kl_coef * kl.sum() / weights.sum()
        if all_action:
            # each replaces one token's surrogate, so it is weighted as one token of the mean
            answer_loss = torch.stack([all_action_loss(first_log_pi[k], batch.answer_tokens[rows[k]],
                                                       action_values[rows[k]]) for k in all_action])
            loss = loss + answer_loss.sum() / weights.sum()
        stats = terms.stats()
        del stats["value_loss"]  # the value head is fitted apart (`_fit_values`)
        if self.config.answer_entropy_coef > 0:
            if batch.answer_tokens is None:
                raise ValueError("answer_entropy_coef > 0 needs the turns' answer tokens (TurnBatch.answer_tokens)")
            answer_entropy = answer_entropies(first_log_pi, [batch.answer_tokens[i] for i in rows]).mean()
            loss = loss - self.config.answer_entropy_coef * answer_entropy
            stats["answer_entropy"] = float(answer_entropy.detach())
        self.backend.backward(loss * share)
        stats["kl_to_base"] = float(kl.detach().sum() / weights.sum())
        return stats, features
