"""Pretrained language models in the league (learners 'text_ppo', 'text_mmd' and 'text_exit').

A member is a base model (agents/lm/pretrained.py) plus LoRA adapters and a value head; it plays any
game with a text view (games/text.py) through `TextLMPolicy`, so it meets nets, bots and other LMs
in the same league. This module connects the pieces to the league's seams:

* `TextLMArchitecture.build` gives a runner an `AdapterWeights` module (only the adapter and value
  head tensors travel from the learner to the runners: a few MB, not the base) and a policy acting
  on the process's shared base (`shared_base`): every LM of one base in a process shares one copy.
* `TextLMLeagueLearner` is the `LeagueLearner`: it turns the runner's rows (`RolloutBatch` with
  `responses`) into turns, scores each turn with the seat's final result (or the invalid-response
  penalty), and runs turn-level PPO (agents/lm/text_ppo.py). Its first snapshot is the untrained base
  (adapters start at zero), which the `base` anchor also plays.
* `TextMMDLeagueLearner` (learner 'text_mmd', OpenSpiel games with a text view) trains the same
  members by magnetic mirror descent on the game's exact tree (agents/lm/text_mmd.py): it reads the
  LM's answer at every information state itself, so the iteration's matches only rate its
  snapshots (as learner 'sdcfr' does).
* `TextExItLeagueLearner` (learner 'text_exit', tic-tac-toe) trains them by expert iteration
  (agents/lm/text_exit.py): every position the LM met in its matches is searched by MCTS over the
  game's rules, and the adapters learn the search's answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ludus.agents.lm.pretrained import PretrainedLMConfig, load_pretrained_lm, restore_adapters, shared_base, trained_state
from ludus.agents.rollout import RolloutBatch
from ludus.agents.snapshot import Lineage, SnapshotRef
from ludus.agents.lm.text_policy import TextLMPolicy, TextPlayConfig, answer_start_tokens
from ludus.agents.lm.text_exit import BOARD_SYMMETRIES, Position, TextExItLearner, board_image, search_targets
from ludus.agents.lm.text_mmd import TextMMDLearner
from ludus.agents.lm.text_ppo import TextPPOLearner, TurnBatch
from ludus.games.core import GameSpec
from ludus.games.text import is_free_text, text_view
from ludus.league.seeds import rng_from_tensor, rng_to_tensor


class AdapterWeights(nn.Module):
    """The tensors an LM member owns (adapters and value head) as a module whose state dict is
    exactly those: what runners receive, load and hand to their policy."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.tensors = {k: v.clone() for k, v in tensors.items()}
        self.policy: TextLMPolicy | None = None
        """The policy acting with these tensors (told when they change)."""

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return dict(self.tensors)

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True, assign: bool = False):  # type: ignore[override]
        if strict and set(state) != set(self.tensors):
            raise ValueError("adapter weights do not match the model's adapters")
        for name, value in state.items():
            self.tensors[name].copy_(value)
        if self.policy is not None:
            self.policy.weights_changed()


class LiveAdapterWeights(AdapterWeights):
    """A learner's own trained tensors, read from its model at every call (no copy kept)."""

    def __init__(self, model: nn.Module):
        nn.Module.__init__(self)
        self.model = model

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return trained_state(self.model)


@dataclass(frozen=True)
class TextLMArchitecture:
    """A pretrained LM with adapters playing through the game's text view."""

    model: PretrainedLMConfig
    play: TextPlayConfig

    @property
    def lm_base(self) -> PretrainedLMConfig:
        return self.model

    def build(self, spec: GameSpec) -> tuple[AdapterWeights, TextLMPolicy]:
        lm = shared_base(self.model)
        weights = AdapterWeights(trained_state(lm.model))
        # the policy holds the module's own tensor dict: loading new weights updates what it swaps in
        weights.policy = TextLMPolicy(lm.model, lm.tokenizer, text_view(spec.id), self.play, adapters=weights.tensors)
        return weights, weights.policy


def turn_returns(batch: RolloutBatch) -> np.ndarray:
    """Monte-Carlo return of every row: the seat's rewards from that turn to the end of its game
    (rows are grouped by (slot, seat) in time order; `dones` ends a game)."""
    returns = np.zeros(len(batch), dtype=np.float64)
    running = 0.0
    for i in range(len(batch) - 1, -1, -1):
        same_sequence = (i + 1 < len(batch) and batch.slots[i + 1] == batch.slots[i]
                         and batch.seats[i + 1] == batch.seats[i] and not batch.dones[i])
        running = batch.rewards[i] + (running if same_sequence else 0.0)
        returns[i] = running
    return returns


class TextLMMember:
    """What every LM learner is: its own copy of the base with adapters (`lm`), the module runners
    receive, a policy that renders prompts and reads responses exactly as its runners' copies do,
    and snapshots of the adapters and value head."""

    def __init__(self, spec: GameSpec, config: Any, init_seed: int):
        self.spec = spec
        self.text = config.text_lm
        self.view = text_view(spec.id)
        self.lm = load_pretrained_lm(self.text.model, seed=init_seed)
        self.architecture = TextLMArchitecture(self.text.model, self.text.play)
        self.module = LiveAdapterWeights(self.lm.model)
        self.policy = TextLMPolicy(self.lm.model, self.lm.tokenizer, self.view, self.text.play)

    def freeze(self, directory: Path, lineage: Lineage) -> SnapshotRef:
        from ludus.agents.lm.snapshots import save_adapter_snapshot

        return save_adapter_snapshot(self.lm, self.spec, directory, lineage, play=self.text.play.to_json())

    def read_row(self, batch: RolloutBatch, i: int) -> tuple[tuple[int, ...], list[int], int | None]:
        """Row `i` of a text agent's batch: the prompt its LM read, the response tokens it wrote and
        the action that response parses to (None: it did not count)."""
        obs, seat, mask = batch.obs[i], int(batch.seats[i]), batch.mask[i]
        length = int((batch.responses[i] >= 0).sum())
        tokens = batch.responses[i, :length].tolist()
        action = self.policy.parse(self.policy.response_text(tokens), obs, seat, mask).action
        return tuple(self.policy.encode(obs, seat, mask)), tokens, action

    def did_not_count(self, batch: RolloutBatch, i: int, action: int | None) -> bool:
        """Whether row `i`'s first response did not count: it named no legal answer of a view that
        lists them (`action` None, from `read_row`). A free-text move has no list to name: the game
        itself judged it (TextArena: the seat is told why, and a second invalid move loses), and the
        row's return already says so."""
        return action is None and not is_free_text(self.view, batch.obs[i], batch.mask[i])

    def model_state(self) -> dict[str, torch.Tensor]:
        """The adapters and the value head, keyed for a learner's state dict ("model.")."""
        return {f"model.{k}": v for k, v in trained_state(self.lm.model).items()}

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        from ludus.agents.ppo_core import prefixed

        self.lm.model.load_state_dict(prefixed(state, "model."), strict=False)

    def load_snapshot(self, snapshot: Path) -> None:
        """Put an 'lm_adapter' snapshot's adapters and value head into the model; one line refuses a
        snapshot whose adapters are not this model's (another `lora` config would load only in part)."""
        from ludus.agents.lm.snapshots import read_adapter_snapshot

        record = read_adapter_snapshot(snapshot, self.text.model, self.spec.id)
        restore_adapters(self.lm, record.manifest.architecture, record.tensors, f"snapshot {record.ref.path}")


class TextLMLeagueLearner(TextLMMember):
    """Turn-level PPO on a pretrained LM's adapters, as a `ludus.league.learners.base.LeagueLearner`."""

    def __init__(self, spec: GameSpec, config: Any, role_index: int, seed: int, init_seed: int):
        super().__init__(spec, config, init_seed)
        self.backend_config = config.learner_backend
        self.seed = seed
        self.ppo = self._new_ppo(seed)

    def _new_ppo(self, seed: int) -> TextPPOLearner:
        return TextPPOLearner(self.lm.model, self.text.ppo, self.text.play.temperature, self.spec.num_players, seed,
                              backend_config=self.backend_config)

    @property
    def updates(self) -> int:
        return self.ppo.updates

    def turns(self, batch: RolloutBatch) -> tuple[TurnBatch, np.ndarray]:
        """The batch's rows as turns, and which rows' first response did not count."""
        if batch.responses is None:
            raise ValueError("text_ppo trains on text agents' rows: this batch carries no responses")
        returns = turn_returns(batch)
        prompts, responses, behaviour = [], [], []
        invalid = np.zeros(len(batch), dtype=bool)
        actions = np.full(len(batch), -1, dtype=np.int64)
        for i in range(len(batch)):
            prompt, tokens, action = self.read_row(batch, i)
            prompts.append(prompt)
            responses.append(tuple(tokens))
            behaviour.append(batch.response_log_probs[i, :len(tokens)])
            invalid[i] = self.did_not_count(batch, i, action)
            actions[i] = -1 if action is None else action
        returns = np.where(invalid, -self.text.play.invalid.penalty, returns)
        answer_tokens = answers = None
        if self.text.ppo.answer_entropy_coef > 0 or self.text.ppo.all_actions:
            legal = [self.view.answers(batch.obs[i], int(batch.seats[i]), batch.mask[i]) for i in range(len(batch))]
            answer_tokens = tuple(answer_start_tokens(self.lm.tokenizer, words) for words in legal)
            # which answer group (legal actions in increasing id order) each response named
            answers = np.array([sorted(set(words.values())).index(a) if a >= 0 else -1
                                for words, a in zip(legal, actions.tolist())], dtype=np.int64)
        return TurnBatch(tuple(prompts), tuple(responses), tuple(behaviour), returns.astype(np.float64),
                         batch.seats.astype(np.int64), batch.values.astype(np.float64), answer_tokens,
                         answers), invalid

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        turns, invalid = self.turns(batch)
        stats = self.ppo.update(turns)
        stats["valid_response_rate"] = float(1.0 - invalid.mean())
        return stats

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapters, value head, both Adam states, role baselines, the shuffling RNG and the update count."""
        state = self.model_state()
        state.update({f"optimizer.{k}": v for k, v in self.ppo.backend.state_dict().items()})
        state.update({f"value_optimizer.{k}": v for k, v in self.ppo.value_backend.state_dict().items()})
        state["baselines"] = torch.from_numpy(self.ppo.baselines.copy())
        state["rng"] = rng_to_tensor(self.ppo.rng)
        state["updates"] = torch.tensor(self.ppo.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from ludus.agents.ppo_core import prefixed

        self.load_model_state(state)
        self.ppo = self._new_ppo(self.seed)
        self.ppo.backend.load_state_dict(prefixed(state, "optimizer."))
        self.ppo.value_backend.load_state_dict(prefixed(state, "value_optimizer."))
        self.ppo.baselines = state["baselines"].numpy().astype(np.float64).copy()
        self.ppo.rng = rng_from_tensor(state["rng"])
        self.ppo.updates = int(state["updates"])

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """Restart from a snapshot's adapters with a fresh optimizer and baselines."""
        self.load_snapshot(snapshot)
        updates = self.ppo.updates
        self.ppo = self._new_ppo(seed)
        self.ppo.updates = updates  # versions keep increasing: runners key weights by version


class TextMMDLeagueLearner(TextLMMember):
    """Magnetic mirror descent of a pretrained LM's answer table on an OpenSpiel game's tree
    (agents/lm/text_mmd.py), as a `ludus.league.learners.base.LeagueLearner`. Its members are the same LM
    members as `text_ppo`'s: same snapshots, same play."""

    def __init__(self, spec: GameSpec, config: Any, role_index: int, seed: int, init_seed: int):
        from ludus.agents.solvers.mmd import information_states
        from ludus.games.adapters.spiel import spiel_game_for, spiel_observation, spiel_observation_kind

        super().__init__(spec, config, init_seed)
        self.game = spiel_game_for(spec.id)
        kind = spiel_observation_kind(spec.id)
        self.states = information_states(self.game, lambda state, seat: spiel_observation(state, seat, kind))
        self.prompts = [self.policy.encode(obs, int(seat), mask) for obs, seat, mask
                        in zip(self.states.observations, self.states.players, self.states.masks)]
        self.answer_tokens = [answer_start_tokens(self.lm.tokenizer, self.view.answers(obs, int(seat), mask))
                              for obs, seat, mask in zip(self.states.observations, self.states.players, self.states.masks)]
        self.mmd = self._new_mmd()

    def _new_mmd(self) -> TextMMDLearner:
        return TextMMDLearner(self.lm.model, self.game, self.states, self.prompts, self.answer_tokens, self.text.mmd,
                              self.text.play.temperature)

    @property
    def updates(self) -> int:
        return self.mmd.updates

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        """MMD iterations on the game tree; `batch` (the matches' rows) is not trained on."""
        return self.mmd.update()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapters, value head (untrained, carried by every snapshot), Adam state and the update count."""
        state = self.model_state()
        state.update({f"optimizer.{k}": v for k, v in self.mmd.optimizer.state_dict().items()})
        state["updates"] = torch.tensor(self.mmd.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from ludus.agents.ppo_core import prefixed

        self.load_model_state(state)
        self.mmd = self._new_mmd()
        self.mmd.optimizer.load_state_dict(prefixed(state, "optimizer."))
        self.mmd.updates = int(state["updates"])

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """Restart from a snapshot's adapters with a fresh optimizer."""
        self.load_snapshot(snapshot)
        updates = self.mmd.updates
        self.mmd = self._new_mmd()
        self.mmd.updates = updates  # versions keep increasing: runners key weights by version


EXIT_GAMES = {"tic_tac_toe": "seat_relative", "spiel:tic_tac_toe": "openspiel"}
"""Games learner 'text_exit' searches, with the layout their observations are read in: their
observation is the whole state (a board), so the position to search is rebuilt from it."""


class TextExItLeagueLearner(TextLMMember):
    """Expert iteration of a pretrained LM (agents/lm/text_exit.py), as a `ludus.league.learners.base.LeagueLearner`:
    the positions of the iteration's matches where the LM was to move are searched (each distinct
    position once while it stays in the buffer) and the adapters take `text_lm.exit.steps` Adam
    steps towards the searches' answers. Its members are the same LM members as `text_ppo`'s."""

    def __init__(self, spec: GameSpec, config: Any, role_index: int, seed: int, init_seed: int):
        import pyspiel

        super().__init__(spec, config, init_seed)
        self.game = pyspiel.load_game(spec.spiel_name)
        self.layout = EXIT_GAMES[spec.id]
        self.seed = seed
        self.exit = self._new_exit(seed)

    def _new_exit(self, seed: int) -> TextExItLearner:
        return TextExItLearner(self.lm.model, self.text.exit, self.text.play.temperature, seed)

    @property
    def updates(self) -> int:
        return self.exit.updates

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        from ludus.agents.bots.builtin import board_from_observation, history_from_board

        if batch.responses is None:
            raise ValueError("text_exit trains on text agents' rows: this batch carries no responses")
        pending: dict[tuple[int, ...], tuple[np.ndarray, int, np.ndarray]] = {}
        invalid = 0
        for i in range(len(batch)):
            prompt, _, action = self.read_row(batch, i)
            invalid += action is None
            if prompt in self.exit:
                self.exit.touch(prompt)
            elif prompt not in pending:
                pending[prompt] = (batch.obs[i], int(batch.seats[i]), batch.mask[i])
        histories = []
        for obs, seat, _ in pending.values():
            history = history_from_board(board_from_observation(obs, seat, self.layout))
            if len(history) % 2 != seat:
                raise ValueError(f"seat {seat} is not to move in the tic-tac-toe position {history}")
            histories.append(history)
        seeds = self.exit.rng.integers(2**31 - 1, size=len(pending))
        targets = search_targets(self.game, histories, self.text.exit, seeds)
        images = 0
        for (prompt, (obs, seat, mask)), target in zip(pending.items(), targets):
            self.exit.add(self._position(prompt, obs, seat, mask, target))
            if not self.text.exit.symmetries:
                continue
            # its distinct images that are neither buffered nor searched now, `symmetries` of them at random
            candidates: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            for symmetry in range(1, len(BOARD_SYMMETRIES)):
                image = board_image(obs, mask, target, symmetry)
                key = tuple(self.policy.encode(image[0], seat, image[1]))
                if key not in self.exit and key not in pending and key not in candidates:
                    candidates[key] = image
            keys = list(candidates)
            for k in self.exit.rng.permutation(len(keys))[:self.text.exit.symmetries]:
                image_obs, image_mask, image_target = candidates[keys[k]]
                self.exit.add(self._position(keys[k], image_obs, seat, image_mask, image_target))
                images += 1
        stats = self.exit.update()
        stats.update({"valid_response_rate": 1.0 - invalid / max(len(batch), 1),
                      "searched_positions": float(len(pending)), "symmetric_positions": float(images),
                      "mean_return": float(turn_returns(batch).mean()) if len(batch) else 0.0})
        return stats

    def _position(self, prompt: tuple[int, ...], obs: np.ndarray, seat: int, mask: np.ndarray, target: np.ndarray
                  ) -> Position:
        """A buffer entry: the position's prompt, its legal answers' first tokens and canonical
        responses ("4]"), and the search's `target` [num_distinct_actions] on its legal moves."""
        from ludus.games.text import canonical_answer

        prefix = self.text.play.prompt.response_prefix
        legal = np.flatnonzero(mask)
        answer_tokens = answer_start_tokens(self.lm.tokenizer, self.view.answers(obs, seat, mask))
        responses = tuple(tuple(self.lm.tokenizer(canonical_answer(self.view, obs, seat, mask, int(a))
                                                  .removeprefix(prefix), add_special_tokens=False)["input_ids"])
                          for a in legal)
        return Position(prompt, answer_tokens, responses, target[legal])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapters, value head (untrained, carried by every snapshot), Adam state, the buffer of
        searched positions, the sampling RNG and the update count."""
        state = self.model_state()
        state.update({f"optimizer.{k}": v for k, v in self.exit.optimizer.state_dict().items()})
        state.update({f"buffer.{k}": v for k, v in self.exit.buffer_state().items()})
        state["rng"] = rng_to_tensor(self.exit.rng)
        state["updates"] = torch.tensor(self.exit.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from ludus.agents.ppo_core import prefixed

        self.load_model_state(state)
        self.exit = self._new_exit(self.seed)
        self.exit.optimizer.load_state_dict(prefixed(state, "optimizer."))
        self.exit.load_buffer_state(prefixed(state, "buffer."))
        self.exit.rng = rng_from_tensor(state["rng"])
        self.exit.updates = int(state["updates"])

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """Restart from a snapshot's adapters with a fresh optimizer (the buffer's searches stay valid)."""
        self.load_snapshot(snapshot)
        updates, buffer = self.exit.updates, self.exit.buffer
        self.exit = self._new_exit(seed)
        self.exit.updates, self.exit.buffer = updates, buffer  # versions keep increasing

