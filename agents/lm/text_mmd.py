"""Magnetic mirror descent for a pretrained LM on a small game's exact tree (pure compute:
`TextMMDLearner.update`).

Where a text game's information states are few (Kuhn poker: 12), the LM's policy is a table that
one batched forward pass reads exactly: at each information state, the distribution of its answer
at the response's first token (the vocabulary grouped by the legal answer each token begins,
`ludus.agents.lm.text_policy.answer_start_tokens`, renormalised over the answers). One MMD iteration
(agents/solvers/mmd.py; Sokota et al. 2023) then

1. reads the table pi_t and computes, on the game tree, every answer's value Q_t at every
   information state with the LM playing both seats (self-play);
2. forms MMD's next table pi* ∝ [pi_t rho^(alpha eta) exp(eta Q_t)]^(1 / (1 + alpha eta)), rho the
   magnet: the base model's own table (the same network with its adapters off: the KL reference of
   `text_ppo`) or uniform;
3. moves the adapters towards pi* by `distill_steps` Adam steps on sum_s KL(pi*(s) || pi(s)) minus
   `format_coef` times the mean log-mass of answer-starting tokens (so that the response stays an
   answer, as the invalid-response penalty does for `text_ppo`).

Why not the sampled turns of `text_ppo`? On Kuhn poker every prompt differs from the others in a
word or two, so an update that moves one answer moves it at all twelve; sampled advantages let a
card-independent "bet and call" take over before the card-dependent part separates (docs/llm.md
has the runs: 0.33 exploitability, always). Exact targets give each information state its own
direction every step, and MMD's last iterate converges (no average of snapshots), so the learner's
adapters themselves are the policy that comes out.

The first-token table is what the LM plays up to the rare response that opens with an answer's
first token and then fails to close it; `ludus evaluate --exploitability` scores the played policy
(every response enumerated, retries included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import pyspiel
import torch

from ludus.agents.lm.model import LMWithValueHead
from ludus.agents.lm.prompt_cache import SharedPromptCache
from ludus.agents.solvers.mmd import InformationStates, action_values, mmd_target, table_exploitability
from ludus.agents.ppo_core import TorchAdam
from ludus.agents.lm.pretrained import adapter_disabled, adapter_parameters
from ludus.agents.lm.text_ppo import answer_log_probs
from ludus.bounds import bounds


@dataclass(frozen=True)
class TextMMDConfig:
    """Magnetic mirror descent of an LM's answer table (the `text_lm.mmd` keys, learner 'text_mmd')."""

    alpha: float = field(default=0.2, metadata=bounds(0, 1000))
    """Weight of the magnet: MMD converges to the quantal response equilibrium regularised towards it;
    smaller alpha, closer to a Nash equilibrium but slower (on Kuhn poker's table, alpha 0.2: a fixed
    point 0.0436 exploitable with a uniform magnet, tests/test_text_mmd.py; ~0.05 with the base's)."""
    eta: float = field(default=1.0, metadata=bounds(0, 1000, low_open=True))
    """MMD's step size (0.3 moved the LM's table too slowly: 0.12-0.18 after 40 iterations)."""
    magnet: Literal["base", "uniform"] = "base"
    """rho: 'base', the base model's answer table (adapters off), or 'uniform' over legal answers."""
    iterations_per_update: int = field(default=1, metadata=bounds(1, 10**6))
    """MMD iterations per league update."""
    distill_steps: int = field(default=8, metadata=bounds(1, 10**6))
    """Adam steps towards each iteration's target table: with too few the LM lags its targets and
    the lag makes the iterates swing (two and four steps left gaps of up to 0.1-0.15 in probability
    and the Queen's calls swinging between the Jack's and the King's)."""
    learning_rate: float = field(default=5e-4, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the LoRA adapters."""
    format_coef: float = field(default=1.0, metadata=bounds(0, 100))
    """Weight of -log(mass of answer-starting tokens), averaged over information states."""
    max_grad_norm: float | None = field(default=None, metadata=bounds(0, None, low_open=True))
    """Global gradient-norm clip; None: none (Adam scales the steps; the recipe was measured without one)."""

    def __post_init__(self) -> None:
        if not self.alpha >= 0 or not self.eta > 0:
            raise ValueError(f"text_lm.mmd needs alpha >= 0 and eta > 0, got {self.alpha} and {self.eta}")
        if self.iterations_per_update < 1 or self.distill_steps < 1:
            raise ValueError("text_lm.mmd.iterations_per_update and distill_steps must be >= 1")
        if not self.learning_rate > 0 or self.format_coef < 0:
            raise ValueError("text_lm.mmd.learning_rate must be > 0 and format_coef >= 0")


@dataclass(frozen=True)
class AnswerTable:
    """An LM's answers at every information state, read in one pass."""

    log_probs: torch.Tensor
    """[S, A] log-probability of each legal action's answer (renormalised over the legal answers;
    -inf where illegal)."""
    log_valid: torch.Tensor
    """[S] log of the first-token mass that begins some legal answer."""


def read_answer_table(model: LMWithValueHead, prompts: Sequence[Sequence[int]], answer_tokens: Sequence[Sequence[np.ndarray]],
                      masks: np.ndarray, temperature: float) -> AnswerTable:
    """The answer table at the first response token of each prompt (shared prefix read once;
    gradients flow when enabled). `answer_tokens[s]`: the answer-start groups of state s's legal
    actions in increasing action order."""
    cache = SharedPromptCache(model, [list(p) for p in prompts])
    logits, _ = model.heads(cache.prompt_hidden[torch.from_numpy(cache.entry_of)])
    log_pi = torch.log_softmax(logits.float() / temperature, dim=-1)
    rows, valid = [], []
    for s, groups in enumerate(answer_tokens):
        legal = np.flatnonzero(masks[s])
        log_q, present = answer_log_probs(log_pi[s], groups)
        if len(present) != len(legal):
            raise ValueError(f"information state {s}: the tokenizer has no token that begins an answer for "
                             f"every legal action ({len(present)} of {len(legal)})")
        row = torch.full((masks.shape[1],), -torch.inf)
        rows.append(row.index_put((torch.from_numpy(legal),), log_q))
        valid.append(torch.logsumexp(log_pi[s][torch.from_numpy(np.concatenate(list(groups)))], dim=0))
    return AnswerTable(torch.stack(rows), torch.stack(valid))


class TextMMDLearner:
    """MMD self-play of an LM's answer table on the game tree; the LoRA adapters are trained."""

    def __init__(self, model: LMWithValueHead, game: pyspiel.Game, states: InformationStates,
                 prompts: Sequence[Sequence[int]], answer_tokens: Sequence[Sequence[np.ndarray]], config: TextMMDConfig,
                 temperature: float):
        self.model, self.game, self.states, self.config, self.temperature = model, game, states, config, temperature
        self.prompts, self.answer_tokens = [list(p) for p in prompts], list(answer_tokens)
        adapters = adapter_parameters(model)
        clip = float("inf") if config.max_grad_norm is None else config.max_grad_norm
        self.optimizer = TorchAdam(adapters, config.learning_rate, 1e-8, clip, fused=False)
        if config.magnet == "base":
            with torch.no_grad(), adapter_disabled(model):
                self.magnet = self._read().log_probs.exp().double().numpy()
        else:
            self.magnet = states.masks / states.masks.sum(axis=1, keepdims=True)
        self.updates = 0

    def _read(self) -> AnswerTable:
        return read_answer_table(self.model, self.prompts, self.answer_tokens, self.states.masks, self.temperature)

    def table(self) -> np.ndarray:
        """[S, A] the LM's current answer table (float64, zeros where illegal)."""
        with torch.no_grad():
            return self._read().log_probs.exp().double().numpy()

    def update(self) -> dict[str, float]:
        config, masks = self.config, torch.from_numpy(self.states.masks)
        self.model.train()
        for _ in range(config.iterations_per_update):
            answers = self._read()
            policy = answers.log_probs.detach().double().exp().numpy()
            values = action_values(self.game, policy)
            target = torch.from_numpy(mmd_target(policy, values, self.magnet, self.states.masks, config.alpha,
                                                 config.eta)).float()
            log_target = torch.where(masks, target.clamp_min(1e-30).log(), torch.zeros_like(target))
            for step in range(config.distill_steps):
                if step:
                    answers = self._read()
                divergence = torch.where(masks, target * (log_target - answers.log_probs), torch.zeros_like(target))
                loss = divergence.sum() - config.format_coef * answers.log_valid.mean()
                grad_norm = self.optimizer.step(loss)
        self.model.eval()
        self.updates += 1
        with torch.no_grad():
            after = self._read()
        table = after.log_probs.exp().double().numpy()
        return {"table_exploitability": table_exploitability(self.game, table),
                "target_gap": float(np.abs(table - target.double().numpy()).max()),
                "kl_to_target": float(divergence.sum().detach()), "grad_norm": grad_norm,
                "valid_first_token_mass": float(after.log_valid.exp().mean())}
