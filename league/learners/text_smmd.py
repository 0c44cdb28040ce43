"""Learner 'text_smmd': a pretrained LM that learns any text game from its own play alone.

The league's side of agents/lm/text_smmd.py (sampled magnetic mirror descent on the answers a
game's view lists, with a learned critic; on free-text responses the same step with PPO's clip
and the base as magnet, on SPIRAL's role baselines). It reads only the runners' rows
(`RolloutBatch` with `responses`): no game tree (`text_mmd`), no search over the rules
(`text_exit`). Its members are the same LM members as the other LM learners' (adapters + value
head; same snapshots, same play), so it is the default LM learner for a game no preset names
(`ludus.league.learners.kinds.DEFAULT_TEXT_LM_LEARNER`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ludus.agents.lm.text_policy import answer_start_tokens
from ludus.agents.lm.text_smmd import PlayTurns, TextSMMDLearner
from ludus.agents.rollout import RolloutBatch
from ludus.games.core import GameSpec
from ludus.games.mix import mix_parts, part_of_observations
from ludus.league.learners.text_lm import TextLMMember, turn_returns
from ludus.league.seeds import rng_from_tensor, rng_to_tensor


class TextSMMDLeagueLearner(TextLMMember):
    """Sampled MMD from play (agents/lm/text_smmd.py) as a `ludus.league.learners.base.LeagueLearner`."""

    def __init__(self, spec: GameSpec, config: Any, role_index: int, seed: int, init_seed: int):
        super().__init__(spec, config, init_seed)
        self.seed, self.init_seed = seed, init_seed
        self.smmd = self._new_smmd(seed)

    def _new_smmd(self, seed: int) -> TextSMMDLearner:
        # SPIRAL's roles are (game, seat) pairs: a run of several games keeps a baseline for each
        return TextSMMDLearner(self.lm.model, self.text.smmd, self.text.play.temperature, self.spec.num_actions,
                               self.spec.num_players * max(len(mix_parts(self.spec.id)), 1), seed)

    @property
    def updates(self) -> int:
        return self.smmd.updates

    def turns(self, batch: RolloutBatch) -> tuple[PlayTurns, np.ndarray]:
        """The batch's rows as turns, and which rows' first response did not count."""
        if batch.responses is None:
            raise ValueError("text_smmd trains on text agents' rows: this batch carries no responses")
        returns = turn_returns(batch)
        prompts, responses, behaviour, groups, canonical = [], [], [], [], []
        known: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
        invalid = np.zeros(len(batch), dtype=bool)
        answers = np.full(len(batch), -1, dtype=np.int64)
        prefixed = bool(self.text.play.prompt.response_prefix)
        for i in range(len(batch)):
            prompt, tokens, action = self.read_row(batch, i)
            prompts.append(prompt)
            responses.append(tuple(tokens))
            behaviour.append(np.asarray(batch.response_log_probs[i, :len(tokens)], dtype=np.float64))
            invalid[i] = self.did_not_count(batch, i, action)
            answers[i] = -1 if action is None else action
            words = self.view.answers(batch.obs[i], int(batch.seats[i]), batch.mask[i]) if prefixed else {}
            answer_groups = answer_start_tokens(self.lm.tokenizer, words) if words else None
            # answer level where every legal action has a token that begins its answer; else free text
            if answer_groups is not None and (len(answer_groups) != int(np.sum(batch.mask[i]))
                                              or not all(len(g) for g in answer_groups)):
                answer_groups = None
            groups.append(answer_groups)
            canonical.append(None if answer_groups is None else
                             self._canonical(prompt, batch.obs[i], int(batch.seats[i]), batch.mask[i], known))
        returns = np.where(invalid, -self.text.play.invalid.penalty, returns)
        roles = batch.seats.astype(np.int64)
        if mix_parts(self.spec.id):
            roles = roles + self.spec.num_players * part_of_observations(batch.obs)
        return PlayTurns(tuple(prompts), tuple(responses), tuple(behaviour), returns.astype(np.float64),
                         roles, answers, np.asarray(batch.mask, dtype=bool),
                         tuple(groups), tuple(canonical)), invalid

    def _canonical(self, prompt: tuple[int, ...], obs: np.ndarray, seat: int, mask: np.ndarray,
                   known: dict[tuple[int, ...], tuple[tuple[int, ...], ...]]) -> tuple[tuple[int, ...], ...]:
        """Each legal action's canonical response tokens after the prefilled opening ("bet]")."""
        from ludus.games.text import canonical_answer

        if prompt not in known:
            prefix = self.text.play.prompt.response_prefix
            known[prompt] = tuple(
                tuple(self.lm.tokenizer(canonical_answer(self.view, obs, seat, mask, int(a)).removeprefix(prefix),
                                        add_special_tokens=False)["input_ids"]) for a in np.flatnonzero(mask))
        return known[prompt]

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        turns, invalid = self.turns(batch)
        stats = self.smmd.update(turns)
        stats["valid_response_rate"] = float(1.0 - invalid.mean()) if len(invalid) else 1.0
        return stats

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapters, value head, critic, both Adam states, role baselines, the sampling RNG and the update count."""
        state = self.model_state()
        state.update({f"optimizer.{k}": v for k, v in self.smmd.optimizer.state_dict().items()})
        state.update({f"critic.{k}": v.detach().clone() for k, v in self.smmd.critic.state_dict().items()})
        state.update({f"critic_optimizer.{k}": v for k, v in self.smmd.critic_optimizer.state_dict().items()})
        state["baselines"] = torch.from_numpy(self.smmd.baselines.copy())
        state["rng"] = rng_to_tensor(self.smmd.rng)
        state["updates"] = torch.tensor(self.smmd.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from ludus.agents.ppo_core import prefixed

        self.load_model_state(state)
        self.smmd = self._new_smmd(self.seed)
        self.smmd.optimizer.load_state_dict(prefixed(state, "optimizer."))
        self.smmd.critic.load_state_dict(prefixed(state, "critic."))
        self.smmd.critic_optimizer.load_state_dict(prefixed(state, "critic_optimizer."))
        self.smmd.baselines = state["baselines"].numpy().astype(np.float64).copy()
        self.smmd.rng = rng_from_tensor(state["rng"])
        self.smmd.updates = int(state["updates"])

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """Restart from a snapshot's adapters with fresh optimizers; the critic (it reads the base's
        features, the same for every snapshot) and the role baselines are kept."""
        self.load_snapshot(snapshot)
        old = self.smmd
        self.smmd = self._new_smmd(seed)
        self.smmd.critic.load_state_dict(old.critic.state_dict())
        self.smmd.baselines, self.smmd.updates = old.baselines, old.updates  # versions keep increasing
