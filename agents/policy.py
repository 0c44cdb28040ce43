"""The Policy protocol: batched action selection over observations and legal masks.

Every agent in Ludus — a neural snapshot, a bot, a sandboxed arena submission — answers the
same call: given N decision points (rows), pick one legal action per row. Rows may come from
different games and seats; batching them is how self-play gets fast (docs/reference.md §1:
an MLP costs 39 us per board alone, 1.65 us per board in a batch of 1,024).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from ludus.games.core import Game


@dataclass(frozen=True)
class ActBatch:
    """N decision points to answer."""

    obs: np.ndarray
    """[N, *observation_shape] observations."""
    mask: np.ndarray
    """[N, A] bool legal actions; every row has at least one True."""
    seats: np.ndarray
    """[N] int seat that acts in each row."""
    histories: Sequence[tuple[int, ...]] | None = None
    """Per row, the game's action history (bots that search, e.g. MCTS, rebuild the state from it)."""
    critic_obs: np.ndarray | None = None
    """[N, D] per row, a centralised critic's input (`ludus.agents.rollout.side_critic_inputs`): given only
    to policies with a true `needs_critic_input` attribute (a MAPPO learner's side)."""

    def __len__(self) -> int:
        return int(self.mask.shape[0])

    @classmethod
    def at_seat(cls, game: "Game", seat: int, policy: "Policy", mask: np.ndarray | None = None) -> "ActBatch":
        """One decision point: `seat` of `game` as it stands, with the game's history for a policy
        that searches from it (`needs_history`); `mask`: the seat's legal mask, if the caller has it."""
        mask = game.legal_mask(seat) if mask is None else mask
        return cls(game.observation(seat)[None], mask[None], np.array([seat], dtype=np.int64),
                   [game.history()] if policy.needs_history else None)


@dataclass(frozen=True)
class ActOutput:
    """The answer to an `ActBatch`."""

    actions: np.ndarray
    """[N] int64 chosen actions (always legal)."""
    log_probs: np.ndarray
    """[N] float32 log-probability of each chosen action under the acting distribution (0 for
    deterministic bots); PPO uses it as the behaviour log-prob."""
    values: np.ndarray
    """[N] float32 value estimates (0 when the agent has no critic)."""
    responses: np.ndarray | None = None
    """Text agents only: [N, W] int64 token ids of the response each action was read from, -1 after
    its end (a turn's action is one whole response; the learner trains on these tokens)."""
    response_log_probs: np.ndarray | None = None
    """Text agents only: [N, W] float32 behaviour log-probability of each response token, 0 after its end."""
    forfeits: np.ndarray | None = None
    """[N] bool: the row's seat gives up the match instead of moving (a text agent none of whose
    responses named a legal action, configured to forfeit); its action is then not played. None: no forfeits."""
    texts: Sequence[str | None] | None = None
    """Text agents in text-move games (`GameSpec.text_moves`): per row, the move as text, which the
    game judges and plays instead of the row's action (None in a row: play the action). None: no texts."""
    said: Sequence[str] | None = None
    """Text agents that reason before they answer: each row's whole first response, reasoning
    included, for transcripts and replays (the move itself is `texts` or `actions`). None: not kept."""
    invalid_answers: np.ndarray | None = None
    """[N] int: responses of the row's turn that the agent itself found invalid (each retried, the
    last replaced by the fallback when none counted); the ledger records them per seat. None: none
    counted."""


@runtime_checkable
class Policy(Protocol):
    """Anything that acts. `greedy=True` picks the most likely legal action (no sampling)."""

    needs_history: bool
    """True when `act` reads `ActBatch.histories` (callers must then provide them)."""

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput: ...


@runtime_checkable
class KeepsReadings(Protocol):
    """A policy that keeps what it computed to reuse it (an LM's prompt store). The runner makes
    it forget at the start of every play task, so that a task's results depend on the task alone:
    a kept reading gives the same floats as a fresh one only up to rounding, and a resumed run
    starts with nothing kept."""

    def forget_readings(self) -> None: ...


@runtime_checkable
class ActsTogether(Protocol):
    """A policy that can answer several policies' batches in one call (`ludus.agents.torch_policy`):
    `act_together([(policy, batch, greedy), ...], rng)` returns what each policy's `act` would, in
    order (up to float rounding), and draws from `rng` exactly as those calls would in turn;
    `ludus.agents.check.check_policy` holds it to both."""

    act_together: Callable[[Sequence[tuple["Policy", ActBatch, bool]], np.random.Generator], list["ActOutput"]]


def act_in_order(requests: Sequence[tuple[Policy, ActBatch, bool]], rng: np.random.Generator) -> list[ActOutput]:
    """Every request's `policy.act(batch, rng, greedy)`, in order. A run of consecutive policies
    that share one `act_together` is answered by one call of it — the same outputs (up to float
    rounding) and the same draws from `rng`, with the per-call work done once (a self-play step
    asks ~17 nets)."""
    outputs: list[ActOutput] = []
    i = 0
    while i < len(requests):
        together = getattr(requests[i][0], "act_together", None)
        j = i + 1
        if together is None:
            policy, batch, greedy = requests[i]
            outputs.append(policy.act(batch, rng, greedy=greedy))
        else:
            while j < len(requests) and getattr(requests[j][0], "act_together", None) is together:
                j += 1
            outputs += together(requests[i:j], rng)
        i = j
    return outputs


class AskedAlone:
    """`policy` without its `act_together`: `act_in_order` asks it on its own, one `act` per batch,
    as runners asked every policy before `ActsTogether` (what the measurements and tests that
    compare the two paths play with)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.needs_history = policy.needs_history

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        return self.policy.act(batch, rng, greedy)


class SeatForfeit(Exception):
    """Raised from an in-process player's `act` to give up the match instead of moving (a person at
    a web seat who did not move in time, `ludus.agents.human_seat`): the match loop records a
    forfeit of that seat with `status` ('timeout', 'error' or 'invalid', as an agent's fault) and
    `reason`, exactly as for a sandboxed agent that faulted."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def zero_output(actions: np.ndarray) -> ActOutput:
    """ActOutput for deterministic bots: log-prob 0 and value 0."""
    n = len(actions)
    return ActOutput(np.asarray(actions, dtype=np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32))


def sample_legal_uniform(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random legal action per row of a [N, A] bool mask, vectorised."""
    counts = mask.sum(axis=1)
    if np.any(counts == 0):
        raise ValueError("a row of the legal mask has no legal action")
    pick = (rng.random(len(mask)) * counts).astype(np.int64)
    # the pick-th True of each row: cumulative count reaches pick+1 there first
    return np.argmax(np.cumsum(mask, axis=1) > pick[:, None], axis=1).astype(np.int64)


class RandomPolicy:
    """Uniform over legal actions."""

    needs_history = False

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        actions = sample_legal_uniform(batch.mask, rng)
        counts = batch.mask.sum(axis=1)
        return ActOutput(actions, -np.log(counts).astype(np.float32), np.zeros(len(actions), np.float32))
