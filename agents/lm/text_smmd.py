"""Sampled magnetic mirror descent of a pretrained LM from its own play (pure compute:
`TextSMMDLearner.update`; learner 'text_smmd', league/learners/text_smmd.py).

It reads only what runners record: per turn, the observation and legal-action mask (rendered into
the prompt the LM read), the response tokens, their behaviour log-probs and the seat's rewards.
No game tree, no search, no oracle.

Turns whose view lists the legal answers (and whose response is opened with
`text_lm.play.prompt.response_prefix`, e.g. "[") are trained at the ANSWER level:

* the policy is the exact answer distribution at the response's first token,
  pi_theta(a | s) = softmax_a log M_a(s), M_a(s) = sum of the first-token probabilities of the tokens
  that begin answer a (`ludus.agents.lm.text_policy.answer_start_tokens`), the table that
  `text_mmd` and Kuhn poker's exploitability read;
* a critic Q_phi(s, a) is a small head on the BASE model's hidden state at that token (adapters off:
  features that do not drift while the adapters learn), fitted to the turns' Monte-Carlo returns of
  the answers actually given (squared error);
* every answer is updated at once (mean actor-critic: the whole Q_phi(s, .) enters), by magnetic
  mirror descent (Sokota et al. 2023, "A unified approach to reinforcement learning, quantal
  response equilibria, and two-player zero-sum games", eq. (3) in closed form, its sampled deep-RL
  form of Sec. 5): with step size eta, magnet weight alpha (the paper's tau) and magnet rho,

      pi*(a | s)  ∝  pi_t(a | s)^(1 / (1 + alpha eta)) · rho(a | s)^(alpha eta / (1 + alpha eta))
                     · exp(eta Q_phi(s, a) / (1 + alpha eta))                                   (MMD)

  pi_t the policy before the update, rho the base model's answer distribution (the untrained LM;
  'uniform' also possible). The adapters then take `distill_steps` Adam steps on

      L(theta) = mean_s KL(pi*(. | s) || pi_theta(. | s)) - format_coef · mean_s log V_theta(s)     (distil)

  V_theta(s) the first-token mass that begins some legal answer (so the response stays an answer),
  plus `rest_coef` times - mean_s sum_a pi*(a|s) log p_theta(rest of a's canonical response "bet]" |
  s, its first token) (as `text_exit`'s rest term: the first token picks the answer, the rest must
  close on it; the answer texts are the view's own list, not an oracle).
  Its last iterate converges to the alpha-regularised quantal response equilibrium in two-player
  zero-sum games (the paper's Theorem 3.4), so the adapters themselves are the output policy.

Turns without an answer list (free-text moves), or whose first response did not count, are trained
on the WHOLE response y by the same mirror-descent step in its sampled, deep-RL form (Sokota et al.
2023, section 5: a policy-gradient surrogate with a proximal term and the magnet term), with
SPIRAL's role-conditioned advantage estimation (Liu et al. 2025, arXiv 2506.24119, Algorithm 1) for
A: per role p a moving-average baseline

      b_p  <-  decay · b_p + (1 - decay) · mean(R over the role's turns),   A = R - b_p          (RAE)

(advantages use the baseline before the batch; turns with |A| <= min_abs_advantage are dropped,
SPIRAL's filtering of zero-advantage turns), and per token t of y_i, r_t = pi_theta / mu (mu: the
behaviour log-probs the runners recorded),

      L(theta) = mean_i sum_t max(-A_i r_t, -A_i clip(r_t, 1 - clip, 1 + clip))            (proximal: KL to pi_t)
                 + alpha · mean_i sum_t (rho_t / pi_t - log(rho_t / pi_t) - 1)             (magnet: KL to rho)

with rho the base model (adapters off): over free text the magnet is the base whatever `magnet`
says (no uniform distribution over all texts exists), and the k3 estimator of KL(pi_theta || rho)
(Schulman 2020) on the sampled tokens. The magnet is what keeps a response in the base's
language: without it, steps that only push sampled responses down (every advantage negative,
e.g. while a game refuses most of the base's moves) drove SmolLM2's Nim answers from
"[0 3]"-like moves into noise in 7 updates. A first response that named no legal action is scored
-invalid.penalty by the caller and lands here too (so a game with answers learns its format as well).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import torch
from torch import nn

from ludus.agents.lm.model import LMWithValueHead
from ludus.agents.lm.prompt_cache import SharedPromptCache, base_readings
from ludus.agents.lm.pretrained import adapter_disabled, adapter_parameters
from ludus.agents.lm.text_ppo import answer_log_probs, response_log_probs
from ludus.agents.ppo_core import TorchAdam, k3, padded, ppo_terms
from ludus.bounds import bounds


@dataclass(frozen=True)
class TextSMMDConfig:
    """Sampled MMD from play (the `text_lm.smmd` keys, learner 'text_smmd')."""

    alpha: float = field(default=0.5, metadata=bounds(0, 1000))
    """Magnet weight (tau in Sokota et al.): the last iterate converges to the equilibrium regularised
    towards rho; smaller, closer to a Nash equilibrium but slower and noisier from samples (tabular
    Kuhn, Q from 32 sampled games an update, 8-15 updates: alpha 0.5 0.10-0.16 exploitable, alpha
    0.2 0.14-0.24; tests/test_text_smmd.py replays it). Free text: the weight of the KL of each
    whole response to the base's."""
    eta: float = field(default=1.0, metadata=bounds(0, 1000, low_open=True))
    """MMD step size: how far one update moves towards exp(Q)."""
    magnet: Literal["base", "uniform"] = "uniform"
    """rho: 'uniform' over the legal answers (MMD then converges to the entropy-regularised quantal
    response equilibrium, whatever the base prefers) or 'base', the base model's answer distribution
    (adapters off). The format stays the base's either way: rho is over answers, not tokens.
    Free-text turns always have the base as their magnet."""
    distill_steps: int = field(default=4, metadata=bounds(1, 10**6))
    """Adam steps of the adapters towards each update's MMD targets (and of the free-text loss).
    Each costs a pass with gradients over the step's prompts: on a shared 2-core host (load ~12) 8
    steps over Kuhn's 11 prompts took ~380 s of an iteration whose 32 matches took 45 s."""
    learning_rate: float = field(default=1e-3, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the LoRA adapters."""
    max_grad_norm: float | None = field(default=1.0, metadata=bounds(0, None, low_open=True))
    """Global gradient-norm clip of the adapters' steps; None: none."""
    minibatch_prompts: int = field(default=64, metadata=bounds(1, 10**6))
    """Distinct prompts (answer-level) or turns (free text) per Adam step, drawn at random."""
    micro_batch_turns: int = field(default=16, metadata=bounds(1, 10**6))
    """Free text: turns per forward/backward pass (and per pass of the base for the magnet); the
    micro-batches' gradients add up to the step's (a TextArena turn reads a 300-1,000-token prompt:
    64 at once held ~8 GB of activations)."""
    format_coef: float = field(default=1.0, metadata=bounds(0, 100))
    """Weight of -log(mass of answer-starting tokens), averaged over the step's prompts."""
    rest_coef: float = field(default=1.0, metadata=bounds(0, 100))
    """Weight of -sum_a pi*(a|s) log p(rest of a's canonical response | its first token): the first
    token picks the answer, this term makes the response close on it (the base SmolLM2 opens Kuhn
    answers with a legal answer's first token 99% of the time but writes a legal answer only ~45%)."""
    critic_hidden: int = field(default=128, metadata=bounds(1, 10**5))
    """Width of the critic's hidden layer (Q_phi: LayerNorm, Linear, tanh, Linear to one value per action)."""
    critic_learning_rate: float = field(default=3e-3, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the critic."""
    critic_steps: int = field(default=20, metadata=bounds(0, 10**6))
    """Full-batch Adam steps of the critic on each update's answered turns (before the actor's target)."""
    rae_decay: float = field(default=0.95, metadata=bounds(0, 1))
    """RAE: decay of each role's moving-average baseline (free-text turns)."""
    min_abs_advantage: float = field(default=1e-6, metadata=bounds(0, None))
    """RAE: turns with |advantage| at most this are dropped (SPIRAL's zero-advantage filter)."""
    clip: float = field(default=0.2, metadata=bounds(0, 10, low_open=True))
    """Free text: PPO's clip of each token's ratio to the behaviour policy (the proximal term of the
    sampled MMD step: one update moves each token's probability at most this far, relatively)."""
    reinforce_coef: float = field(default=1.0, metadata=bounds(0, 100))
    """Weight of the free-text policy-gradient loss beside the answer-level one."""

    def __post_init__(self) -> None:
        if not self.alpha >= 0 or not self.eta > 0:
            raise ValueError(f"text_lm.smmd needs alpha >= 0 and eta > 0, got {self.alpha} and {self.eta}")
        if self.distill_steps < 1 or self.minibatch_prompts < 1 or self.critic_hidden < 1:
            raise ValueError("text_lm.smmd.distill_steps, minibatch_prompts and critic_hidden must be >= 1")
        if not self.learning_rate > 0 or not self.critic_learning_rate > 0 or self.format_coef < 0:
            raise ValueError("text_lm.smmd learning rates must be > 0 and format_coef >= 0")
        if not self.clip > 0:
            raise ValueError(f"text_lm.smmd.clip must be > 0, got {self.clip}")
        if not 0 <= self.rae_decay <= 1:
            raise ValueError(f"text_lm.smmd.rae_decay must be in [0, 1], got {self.rae_decay}")


def mmd_answer_target(log_pi: torch.Tensor, log_rho: torch.Tensor, q: torch.Tensor, legal: torch.Tensor,
                      alpha: float, eta: float) -> torch.Tensor:
    """Equation (MMD), in log space, rows [N, A]: log pi* = [log pi_t + alpha eta log rho + eta Q]
    / (1 + alpha eta), normalised over the legal answers (-inf elsewhere)."""
    logits = (log_pi + alpha * eta * log_rho + eta * q) / (1.0 + alpha * eta)
    logits = torch.where(legal, logits, torch.full_like(logits, -torch.inf))
    return torch.log_softmax(logits, dim=-1)


def answer_table(first_log_pi: torch.Tensor, groups: Sequence[Sequence[np.ndarray]], masks: np.ndarray
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """([S, A] log pi(a|s): each legal answer's first-token mass renormalised over the legal answers,
    -inf elsewhere; [S] log of the answer-starting first-token mass) from first-token log-probs [S, V]."""
    rows, valid = [], []
    for s, answer_groups in enumerate(groups):
        legal = np.flatnonzero(masks[s])
        log_q, present = answer_log_probs(first_log_pi[s], answer_groups)
        row = torch.full((masks.shape[1],), -torch.inf)
        rows.append(row.index_put((torch.from_numpy(legal[present]),), log_q))
        valid.append(torch.logsumexp(first_log_pi[s][torch.from_numpy(np.concatenate(list(answer_groups)))], dim=0))
    return torch.stack(rows), torch.stack(valid)


class AnswerCritic(nn.Module):
    """Q_phi(s, .): one value per action from the base model's hidden state at the answer."""

    def __init__(self, hidden_size: int, width: int, num_actions: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(hidden_size, elementwise_affine=False), nn.Linear(hidden_size, width),
                                 nn.Tanh(), nn.Linear(width, num_actions))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features.float())


@dataclass(frozen=True)
class PlayTurns:
    """One update's turns as the learner reads them."""

    prompts: tuple[tuple[int, ...], ...]
    """The prompt each turn's LM read (the response prefix included)."""
    responses: tuple[tuple[int, ...], ...]
    """The first response's tokens."""
    behaviour: tuple[np.ndarray, ...]
    """Their behaviour log-probs (the runners' record)."""
    returns: np.ndarray
    """[N] Monte-Carlo return of the turn (-invalid.penalty where the first response did not count)."""
    roles: np.ndarray
    """[N] the seat (SPIRAL's role) of each turn."""
    answers: np.ndarray
    """[N] the action the first response named, -1 for none or a turn trained on free text."""
    masks: np.ndarray
    """[N, A] legal actions."""
    answer_tokens: tuple[tuple[np.ndarray, ...] | None, ...]
    """Per turn: the answer-start token groups of its legal actions (increasing action id), or None:
    the turn is trained on its whole response (free text, or a first response that did not count)."""
    canonical: tuple[tuple[tuple[int, ...], ...] | None, ...] | None = None
    """Per answer-level turn: each legal action's canonical response tokens ("bet]" after the prefix),
    increasing action id; None: no rest term (`rest_coef`)."""

    def __len__(self) -> int:
        return len(self.prompts)


class TextSMMDLearner:
    """Sampled MMD on answers with a learned critic, and on free text PPO-clipped with the base as
    magnet; LoRA adapters trained."""

    def __init__(self, model: LMWithValueHead, config: TextSMMDConfig, temperature: float, num_actions: int,
                 num_roles: int, seed: int):
        self.model, self.config, self.temperature = model, config, temperature
        clip = float("inf") if config.max_grad_norm is None else config.max_grad_norm
        self.optimizer = TorchAdam(adapter_parameters(model), config.learning_rate, 1e-8, clip, fused=False)
        hidden = int(model.lm.get_output_embeddings().weight.shape[1])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.critic = AnswerCritic(hidden, config.critic_hidden, num_actions)
        self.critic_optimizer = TorchAdam(list(self.critic.parameters()), config.critic_learning_rate, 1e-8,
                                          float("inf"), fused=False)
        self.baselines = np.zeros(num_roles, dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    # ------------------------------------------------------------------ readings

    def read_answers(self, prompts: Sequence[Sequence[int]], groups: Sequence[Sequence[np.ndarray]],
                     masks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """([S, A] log pi(a|s) over legal answers (-inf elsewhere), [S] log of the answer-starting
        first-token mass, [S, H] hidden states) at the first response token; gradients flow when enabled."""
        # activated adapters: the base's readings of the prompts are kept for the run (and shared with
        # the runners in this process), so a step reads only the activation tokens with the adapters
        cache = SharedPromptCache(self.model, [list(p) for p in prompts], store=self._store())
        hidden = cache.prompt_hidden[torch.from_numpy(cache.entry_of)]
        logits, _ = self.model.heads(hidden)
        log_pi = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        table, valid = answer_table(log_pi, groups, masks)
        return table, valid, hidden

    def _store(self):
        return base_readings(self.model) if self.model.activation_tokens else None

    # ------------------------------------------------------------------ the update

    def _free_text_loss(self, turns: PlayTurns, free: list[int], part: np.ndarray, advantages: np.ndarray,
                        free_base: torch.Tensor, step_size: int) -> tuple[torch.Tensor, float]:
        """The free-text loss of the step's turns `part` (indices into `free`), as its share of a step
        over `step_size` turns (so the micro-batches' gradients add up to the step's), and its magnet
        term's value."""
        config = self.config
        rows = [free[k] for k in part]
        reading = response_log_probs(self.model, [turns.prompts[i] for i in rows], [turns.responses[i] for i in rows],
                                     self.temperature, store=self._store())
        mask = reading.mask
        log_pi = torch.where(mask, reading.log_probs, torch.zeros_like(reading.log_probs))
        behaviour = padded((turns.behaviour[i] for i in rows), log_pi.shape[1])
        adv = torch.from_numpy(advantages[part])[:, None].expand_as(log_pi)
        weights = mask.float()
        # the proximal term: PPO's clipped surrogate per token (its token mean, times the tokens of
        # these responses: summed over each response)
        zeros = torch.zeros_like(log_pi)
        surrogate = ppo_terms(log_pi, behaviour, adv, zeros, zeros, zeros, zeros, config.clip,
                              value_clip=None, weights=weights).policy_loss * weights.sum() / step_size
        # the magnet term: k3 estimate of KL(pi_theta || base) on the sampled tokens, per response
        # (these rows are padded to their own longest response, not to all free rows')
        base = free_base[torch.from_numpy(part), :log_pi.shape[1]]
        magnet = (k3(torch.where(mask, base - log_pi, torch.zeros_like(log_pi))) * weights).sum() / step_size
        # both per response (summed over its tokens), as the sequence is the action
        return config.reinforce_coef * surrogate + config.alpha * magnet, float(magnet.detach())

    def update(self, turns: PlayTurns) -> dict[str, float]:
        config, stats = self.config, {}
        answered = [i for i in range(len(turns)) if turns.answer_tokens[i] is not None]
        free = [i for i in range(len(turns)) if turns.answer_tokens[i] is None]

        # 1. answer level: distinct prompts, the policy before the update pi_t, the magnet rho, Q_phi
        index: dict[tuple[int, ...], int] = {}
        of_turn = np.array([index.setdefault(turns.prompts[i], len(index)) for i in answered], dtype=np.int64)
        first_turn = {d: answered[k] for k, d in reversed(list(enumerate(of_turn.tolist())))}
        prompts = list(index)
        groups = [turns.answer_tokens[first_turn[d]] for d in range(len(prompts))]
        masks = np.stack([turns.masks[first_turn[d]] for d in range(len(prompts))]) if prompts else None
        target = None
        if prompts:
            legal = torch.from_numpy(masks.astype(bool))
            with torch.no_grad():
                log_pi_t, _, _ = self.read_answers(prompts, groups, masks)
                with adapter_disabled(self.model):
                    log_base, _, features = self.read_answers(prompts, groups, masks)
            # 2. critic: Q_phi(s, a) -> R for the answers given (squared error, full batch)
            rows = torch.from_numpy(of_turn)
            chosen = torch.from_numpy(turns.answers[answered])
            returns = torch.from_numpy(turns.returns[answered]).float()
            valid = chosen >= 0

            def critic_loss() -> torch.Tensor:
                q = self.critic(features[rows]).gather(1, chosen.clamp_min(0)[:, None]).squeeze(1)
                return 0.5 * (((q - returns) ** 2) * valid).sum() / valid.sum().clamp_min(1)

            with torch.no_grad():
                stats["critic_loss"] = float(critic_loss())
            if bool(valid.any()):
                for _ in range(config.critic_steps):
                    self.critic_optimizer.step(critic_loss())
            with torch.no_grad():
                stats["critic_loss_after_fit"] = float(critic_loss())
                q = self.critic(features).masked_fill(~legal, 0.0)
            # 3. MMD's target (equation MMD) with rho the base's answers, or uniform
            log_rho = log_base if config.magnet == "base" else torch.log(legal.float() / legal.sum(1, keepdim=True))
            log_rho = torch.where(legal, log_rho, torch.zeros_like(log_rho))
            zero = torch.zeros_like(log_pi_t)
            target = mmd_answer_target(torch.where(legal, log_pi_t, zero), log_rho, q, legal, config.alpha, config.eta)
            stats["q_spread"] = float((q.max(1).values - q.masked_fill(~legal, torch.inf).min(1).values).mean())

        # free text: RAE advantages (before this batch's baselines move), zero-advantage turns dropped
        if free:
            free_returns, free_roles = turns.returns[free], turns.roles[free]
            advantages = (free_returns - self.baselines[free_roles]).astype(np.float32)
            for role in np.unique(free_roles):
                self.baselines[role] = (config.rae_decay * self.baselines[role]
                                        + (1 - config.rae_decay) * float(free_returns[free_roles == role].mean()))
            kept = np.abs(advantages) > config.min_abs_advantage
            free, advantages = [i for i, k in zip(free, kept) if k], advantages[kept]
            stats["free_text_turns"] = float(len(free))
            if free:
                # the magnet rho: the base's log-probs of each response, read once before the steps
                # (in micro-batches too: an update has hundreds of free turns, each a long prompt)
                free_base = torch.zeros((len(free), max(len(turns.responses[i]) for i in free)))
                with torch.no_grad(), adapter_disabled(self.model):
                    for start in range(0, len(free), config.micro_batch_turns):
                        rows = free[start:start + config.micro_batch_turns]
                        reading = response_log_probs(self.model, [turns.prompts[i] for i in rows],
                                                     [turns.responses[i] for i in rows], self.temperature,
                                                     store=self._store())
                        free_base[start:start + len(rows), :reading.log_probs.shape[1]] = torch.where(
                            reading.mask, reading.log_probs, torch.zeros_like(reading.log_probs))

        # 4. Adam steps of the adapters on (distil) and (free text)
        self.model.train()
        grad_norms, kls, rests, magnets = [], [], [], []
        canonical = None
        if prompts and config.rest_coef > 0 and turns.canonical is not None:
            canonical = [turns.canonical[first_turn[d]] for d in range(len(prompts))]
            if any(c is None for c in canonical):
                canonical = None
        for _ in range(config.distill_steps):
            if prompts:
                loss = torch.zeros(())
                pick = np.sort(self.rng.permutation(len(prompts))[:config.minibatch_prompts])
                t = target[torch.from_numpy(pick)]
                legal_pick = torch.isfinite(t)
                if canonical is None:
                    log_pi, log_valid, _ = self.read_answers([prompts[d] for d in pick], [groups[d] for d in pick],
                                                             masks[pick])
                else:
                    # every legal answer's canonical response read after its prompt: the first token's
                    # distribution gives the answer table, the tokens after it the rest term
                    pairs = [(j, a) for j, d in enumerate(pick) for a in np.flatnonzero(masks[d])]
                    reading = response_log_probs(self.model, [prompts[pick[j]] for j, _ in pairs],
                                                 [canonical[pick[j]][k] for (j, _), k in
                                                  zip(pairs, [int(np.sum(masks[pick[j]][:a])) for j, a in pairs])],
                                                 self.temperature, store=self._store())
                    first = {}
                    for r, (j, _) in enumerate(pairs):
                        first.setdefault(j, r)
                    log_pi, log_valid = answer_table(reading.first_log_pi[[first[j] for j in range(len(pick))]],
                                                     [groups[d] for d in pick], masks[pick])
                    rest = (reading.log_probs[:, 1:] * reading.mask[:, 1:]).sum(1)
                    weights = torch.stack([t[j, a] for j, a in pairs]).exp()
                    loss = loss - config.rest_coef * (weights * rest).sum() / len(pick)
                    rests.append(float((rest.detach().exp() * weights).sum() / len(pick)))
                kl = torch.where(legal_pick, t.exp() * (t - log_pi), torch.zeros_like(t)).sum(1)
                loss = loss + kl.mean() - config.format_coef * log_valid.mean()
                kls.append(float(kl.mean().detach()))
                self.optimizer.backward(loss)  # gradients accumulate until `apply`: one step
            if free:
                pick = np.sort(self.rng.permutation(len(free))[:config.minibatch_prompts])
                magnet = 0.0
                for start in range(0, len(pick), config.micro_batch_turns):
                    part = pick[start:start + config.micro_batch_turns]
                    part_loss, part_magnet = self._free_text_loss(turns, free, part, advantages, free_base, len(pick))
                    self.optimizer.backward(part_loss)
                    magnet += part_magnet
                magnets.append(magnet)
            if not prompts and not free:
                break
            grad_norms.append(self.optimizer.apply())
        self.model.eval()
        self.updates += 1
        if prompts:
            with torch.no_grad():
                after, log_valid, _ = self.read_answers(prompts, groups, masks)
            legal = torch.isfinite(target)
            gap = torch.where(legal, (after.exp() - target.exp()).abs(), torch.zeros_like(after))
            stats.update({"target_gap": float(gap.max()), "kl_to_target": kls[-1] if kls else 0.0,
                          "valid_first_token_mass": float(log_valid.exp().mean()),
                          "answer_prompts": float(len(prompts))})
            if rests:
                stats["response_rest_prob"] = rests[-1]
        if magnets:
            stats["kl_to_base"] = magnets[-1]
        stats.update({"grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
                      "mean_return": float(turns.returns.mean()) if len(turns) else 0.0, "turns": float(len(turns))})
        stats.update({f"rae_baseline_seat{r}": float(b) for r, b in enumerate(self.baselines)})
        return stats
