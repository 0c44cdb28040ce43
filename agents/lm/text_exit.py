"""Expert iteration for a pretrained LM on a deterministic perfect-information game (pure compute:
`search_targets`, `TextExItLearner.update`).

Expert iteration (Anthony, Tian & Barber 2017, "Thinking Fast and Slow with Deep Learning and Tree
Search"; AlphaZero's policy update, Silver et al. 2018) alternates an apprentice and an expert: the
apprentice (here the LM) plays, a tree search over the game's own rules (the expert) looks at each
position the apprentice met and says which move it would make there, and the apprentice is trained
to answer as the search does. The search is OpenSpiel's C++ MCTS with random rollouts (UCT, Kocsis &
Szepesvári 2006), the same search as the `mcts` bots; no value or policy network guides it, so it
is as strong on the first iteration as on the last and the loop is imitation of a fixed expert
over the positions the apprentice's own play reaches (Ross et al. 2011, DAgger, is the same
argument for why those positions and not the expert's own).

Why not the end-of-game reward of `text_ppo`? A tic-tac-toe game gives one result for its ~4
moves, and ~250 turns an update taught SmolLM2-135M about 0.75 against the random mover in 30
minutes here, where a label for every position (a perfect teacher) passed 0.85 in ~1,200 steps
(docs/llm.md). The search supplies such a label for every position the LM meets, from the rules
alone: it knows nothing of the opponent the LM is measured against.

The loss at a position imitates the search's move written out: the cross-entropy of the search's
move distribution to the LM's answer at the response's first token over the whole vocabulary,
-sum_a target(a) log m(a), m(a) the first-token mass of the tokens that begin answer a
(`ludus.agents.lm.text_policy.answer_start_tokens`), plus -sum_a target(a) log p(rest of a's canonical
response | its first token), the rest being the closing "]". The first term is not renormalised
over the answers, so mass on text that names no legal move is pushed down as well (the
invalid-response penalty's job in `text_ppo`); without the second, the adapters (which also act on
the response's later tokens) were free to spoil the closing bracket: valid responses fell from 1.00
to 0.57 in a tic-tac-toe run while the first token's legal mass stayed 0.99. Positions and their
targets are kept in a buffer of the most recent distinct positions, and each update makes `steps`
Adam steps on minibatches drawn from it; with activated adapters a step reads with gradients only
the activation tokens and the response of each position (agents/lm/prompt_cache.py `BaseReadings`), ~1.3-1.5 s
for 32 positions on this CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ludus.agents.lm.model import LMWithValueHead
from ludus.agents.lm.prompt_cache import base_readings
from ludus.agents.ppo_core import TorchAdam
from ludus.agents.lm.pretrained import adapter_parameters
from ludus.agents.lm.text_ppo import answer_masses, response_log_probs
from ludus.bounds import bounds


@dataclass(frozen=True)
class TextExItConfig:
    """Expert iteration of an LM's answers with MCTS as the expert (the `text_lm.exit` keys,
    learner 'text_exit')."""

    simulations: int = field(default=2000, metadata=bounds(1, 10**7))
    """MCTS simulations per searched position (tic-tac-toe: ~2-4 ms each in OpenSpiel's C++; 2,000
    with random rollouts scored 0.97 against the random mover as a bot, both seats)."""
    uct_c: float = field(default=2.0, metadata=bounds(0, 100, low_open=True))
    """UCT's exploration constant (the `mcts` bots' default)."""
    rollouts: int = field(default=1, metadata=bounds(1, 10**4))
    """Random rollouts averaged per leaf."""
    target_temperature: float = field(default=0.0, metadata=bounds(0, 100))
    """The target is proportional to the root's visit counts ** (1 / target_temperature); 0 puts all
    of it on the most visited moves (ties split). AlphaZero's 1.0 keeps the search's spread, which
    its self-play samples for exploration; here sampling at `text_lm.play.temperature` explores,
    and a score against an opponent is made by playing the best move, not the search's spread."""
    buffer_positions: int = field(default=4096, metadata=bounds(1, 10**8))
    """Most recent distinct positions (with their targets) kept to train on; a position met again
    moves to the front and keeps its first search's target."""
    steps: int = field(default=48, metadata=bounds(1, 10**6))
    """Adam steps per update, each on `batch_size` positions drawn uniformly from the buffer: on
    tic-tac-toe the steps, not the positions, are what is scarce (a perfect teacher's labels
    needed ~1,200 steps of 32 positions, docs/llm.md), so an update takes about as long as the
    32 matches before it."""
    batch_size: int = field(default=32, metadata=bounds(1, 10**6))
    """Positions per Adam step."""
    learning_rate: float = field(default=1e-3, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the LoRA adapters (the perfect-teacher probe's, docs/llm.md)."""
    max_grad_norm: float = field(default=1.0, metadata=bounds(0, None, low_open=True))
    """Global gradient-norm clip."""
    symmetries: int = field(default=0, metadata=bounds(0, 7))
    """Images of each searched position under the board's rotations and reflections (at most 7),
    drawn at random among its distinct images not yet buffered, added to the buffer with the
    search's target carried over: labels without a search, as AlphaGo Zero augmented its positions
    by the board's dihedral symmetry (Silver et al. 2017). The LM reads the board as text, so each
    image is a new prompt (~0.3 s of the base's reading and ~5.2 MB of `BaseReadings` here)."""

    def __post_init__(self) -> None:
        if self.simulations < 1 or self.rollouts < 1 or not self.uct_c > 0:
            raise ValueError("text_lm.exit needs simulations >= 1, rollouts >= 1 and uct_c > 0")
        if self.target_temperature < 0:
            raise ValueError(f"text_lm.exit.target_temperature must be >= 0, got {self.target_temperature}")
        if self.buffer_positions < 1 or self.steps < 1 or self.batch_size < 1:
            raise ValueError("text_lm.exit.buffer_positions, steps and batch_size must be >= 1")
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError("text_lm.exit.learning_rate and max_grad_norm must be > 0")
        if not 0 <= self.symmetries < len(BOARD_SYMMETRIES):
            raise ValueError(f"text_lm.exit.symmetries must be in 0..{len(BOARD_SYMMETRIES) - 1}, "
                             f"got {self.symmetries}")


def _dihedral(cells: np.ndarray) -> np.ndarray:
    """The 8 rotations and reflections of a square grid of cell ids, each flattened, identity first."""
    turns = [np.rot90(cells, k) for k in range(4)]
    return np.stack([g.reshape(-1) for g in turns + [t.T for t in turns]])


BOARD_SYMMETRIES = _dihedral(np.arange(9).reshape(3, 3))
"""[8, 9] tic-tac-toe's symmetries (cells numbered row by row), the identity first: under symmetry
g, cell p of the image holds what cell BOARD_SYMMETRIES[g, p] of the original holds."""


def board_image(planes: np.ndarray, mask: np.ndarray, target: np.ndarray, symmetry: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A position's image under `symmetry` (a row of `BOARD_SYMMETRIES`): its observation (any
    number of 9-cell planes, flattened), legal mask and move target [9], each cell p of the image
    taken from cell BOARD_SYMMETRIES[symmetry, p] of the original."""
    order = BOARD_SYMMETRIES[symmetry]
    image = np.asarray(planes).reshape(-1, 9)[:, order].reshape(np.shape(planes))
    return image, np.asarray(mask)[order], np.asarray(target)[order]


def visit_target(counts: np.ndarray, temperature: float) -> np.ndarray:
    """Counts ** (1 / temperature), normalised; temperature 0: uniform over the most visited."""
    counts = np.asarray(counts, dtype=np.float64)
    if temperature == 0:
        best = counts == counts.max()
        return best / best.sum()
    # in log space: counts ** 50 overflows float64 for counts in the thousands
    logits = np.where(counts > 0, np.log(np.maximum(counts, 1e-300)) / temperature, -np.inf)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def search_targets(game, histories: Sequence[Sequence[int]], config: TextExItConfig, seeds: Sequence[int]
                   ) -> np.ndarray:
    """[N, num_distinct_actions] the search's move distribution at each position (the state after
    `histories[i]`, searched with seed `seeds[i]`): the root's visit counts through
    `visit_target`. `game` is a pyspiel game of the kind MCTS replays (deterministic, sequential,
    perfect information)."""
    import pyspiel

    targets = np.zeros((len(histories), game.num_distinct_actions()), dtype=np.float64)
    for i, history in enumerate(histories):
        state = game.new_initial_state()
        for action in history:
            state.apply_action(int(action))
        if state.is_terminal():
            raise ValueError(f"position {i}: the game is over after {list(history)}; there is nothing to search")
        evaluator = pyspiel.RandomRolloutEvaluator(config.rollouts, int(seeds[i]))
        # solve=False: with MCTS-Solver a proven subtree stops collecting visits, and the counts no
        # longer rank the moves; random-rollout values rank them well enough in small games
        bot = pyspiel.MCTSBot(game, evaluator, config.uct_c, config.simulations, 1000, False, int(seeds[i]), False)
        root = bot.mcts_search(state)
        actions = np.array([child.action for child in root.children], dtype=np.int64)
        counts = np.array([child.explore_count for child in root.children], dtype=np.float64)
        targets[i, actions] = visit_target(counts, config.target_temperature)
    return targets


@dataclass(frozen=True)
class Position:
    """One searched position of the buffer: what the LM reads and what the search answered."""

    prompt: tuple[int, ...]
    """Token ids the LM reads (chat template and response prefix included)."""
    answer_tokens: tuple[np.ndarray, ...]
    """Per legal action (increasing id order), the token ids that begin its answer."""
    responses: tuple[tuple[int, ...], ...]
    """Per legal action (increasing id order), its canonical response after the prompt ("4]")."""
    target: np.ndarray
    """[len(answer_tokens)] the search's distribution over those actions."""

    def __post_init__(self) -> None:
        if not len(self.target) == len(self.answer_tokens) == len(self.responses):
            raise ValueError(f"a target over {len(self.target)} moves for {len(self.answer_tokens)} answers and "
                             f"{len(self.responses)} responses")
        if any(len(group) == 0 for group in self.answer_tokens) or any(len(r) == 0 for r in self.responses):
            raise ValueError("the tokenizer has no token that begins an answer for every legal move")


class TextExItLearner:
    """The apprentice's side of expert iteration: a buffer of searched positions and Adam steps of
    the LoRA adapters towards the search's answers (the search itself is `search_targets`)."""

    def __init__(self, model: LMWithValueHead, config: TextExItConfig, temperature: float, seed: int):
        self.model, self.config, self.temperature = model, config, temperature
        self.optimizer = TorchAdam(adapter_parameters(model), config.learning_rate, 1e-8, config.max_grad_norm,
                                   fused=False)
        self.buffer: OrderedDict[tuple[int, ...], Position] = OrderedDict()
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def __contains__(self, prompt: tuple[int, ...]) -> bool:
        return prompt in self.buffer

    def touch(self, prompt: tuple[int, ...]) -> None:
        """A buffered position met again: it becomes the most recent."""
        self.buffer.move_to_end(prompt)

    def add(self, position: Position) -> None:
        self.buffer[position.prompt] = position
        self.buffer.move_to_end(position.prompt)
        while len(self.buffer) > self.config.buffer_positions:
            self.buffer.popitem(last=False)

    def loss(self, positions: Sequence[Position]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean loss over `positions`, [B] total legal first-token mass, [R] probability of each
        targeted response's rest given its first token), gradients flowing to the adapters in the first."""
        # one row per targeted move of each position: its canonical response, weighted by the target
        rows = [(j, k) for j, p in enumerate(positions) for k in np.flatnonzero(p.target > 0)]
        store = base_readings(self.model) if self.model.activation_tokens else None
        reading = response_log_probs(self.model, [positions[j].prompt for j, _ in rows],
                                     [positions[j].responses[k] for j, k in rows], self.temperature, store=store)
        rest = (reading.log_probs[:, 1:] * reading.mask[:, 1:]).sum(dim=1)  # [R] log p(rest | first token)
        weights = torch.tensor([positions[j].target[k] for j, k in rows], dtype=torch.float32)
        first_row: dict[int, int] = {}  # each position's first row: its first-token distribution
        for r, (j, _) in enumerate(rows):
            first_row.setdefault(j, r)
        first, legal = [], []
        for j, position in enumerate(positions):
            log_mass = answer_masses(reading.first_log_pi[first_row[j]], position.answer_tokens)
            first.append(-(torch.from_numpy(position.target).float() * log_mass).sum())
            legal.append(torch.logsumexp(log_mass, dim=0).exp())
        loss = (torch.stack(first).sum() - (weights * rest).sum()) / len(positions)
        return loss, torch.stack(legal).detach(), rest.detach().exp()

    def update(self) -> dict[str, float]:
        """`steps` Adam steps on minibatches drawn from the buffer."""
        if not self.buffer:
            raise ValueError("text_exit has no searched positions to train on: its matches gave the LM no turn")
        positions = list(self.buffer.values())
        size = min(self.config.batch_size, len(positions))
        losses, legal, closing, grad_norms = [], [], [], []
        self.model.train()
        for _ in range(self.config.steps):
            rows = self.rng.choice(len(positions), size=size, replace=False)
            loss, mass, rest = self.loss([positions[i] for i in rows])
            grad_norms.append(self.optimizer.step(loss))
            losses.append(float(loss.detach()))
            legal.append(float(mass.mean()))
            closing.append(float(rest.mean()))
        self.model.eval()
        self.updates += 1
        return {"exit_loss": float(np.mean(losses)), "exit_loss_last": losses[-1],
                "legal_first_token_mass": float(np.mean(legal)), "response_rest_prob": float(np.mean(closing)),
                "grad_norm": float(np.mean(grad_norms)),
                "buffer_positions": float(len(self.buffer))}

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """The buffer as tensors (oldest first): token sequences flattened with their lengths,
        targets flattened."""
        positions = list(self.buffer.values())
        groups = [g for p in positions for g in p.answer_tokens]
        responses = [np.asarray(r, dtype=np.int64) for p in positions for r in p.responses]
        return {"prompts": _flat([np.asarray(p.prompt, dtype=np.int64) for p in positions]),
                "prompt_lengths": _lengths([p.prompt for p in positions]),
                "answers_per_position": _lengths([p.answer_tokens for p in positions]),
                "group_tokens": _flat(groups), "group_sizes": _lengths(groups),
                "response_tokens": _flat(responses), "response_lengths": _lengths(responses),
                "targets": torch.from_numpy(np.concatenate([p.target for p in positions]) if positions
                                            else np.zeros(0))}

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None:
        """The buffer `buffer_state` saved, in its order."""
        self.buffer.clear()
        prompts = _split(state["prompts"], state["prompt_lengths"])
        groups = _split(state["group_tokens"], state["group_sizes"])
        responses = _split(state["response_tokens"], state["response_lengths"])
        targets = state["targets"].numpy().astype(np.float64)
        offset = 0
        for prompt, count in zip(prompts, state["answers_per_position"].tolist()):
            moves = slice(offset, offset + count)
            key = tuple(int(t) for t in prompt)
            self.buffer[key] = Position(key, tuple(groups[moves]),
                                        tuple(tuple(int(t) for t in r) for r in responses[moves]), targets[moves].copy())
            offset += count


def _lengths(sequences: Sequence[Sequence]) -> torch.Tensor:
    return torch.tensor([len(x) for x in sequences], dtype=torch.int64)


def _flat(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(arrays) if len(arrays) else np.zeros(0, dtype=np.int64))


def _split(flat: torch.Tensor, lengths: torch.Tensor) -> list[np.ndarray]:
    """The arrays `_flat` joined, given their `_lengths`."""
    lengths = lengths.numpy()
    return np.split(flat.numpy(), np.cumsum(lengths)[:-1]) if len(lengths) else []
