"""`negotiation_turns`: the negotiation of games/builtin/negotiation.py played one whole utterance per step.

The same contexts (`context_from_seed`: pool, private values, Lewis et al. 2017's constraints),
the same payoffs, the same turn limit. A step is one utterance, chosen from what the token game's
parser can tell apart: a PROPOSAL ("I want a books, b hats, c balls"; the partner gets the rest)
or DEAL (accept the partner's standing offer). Chat changes nothing in the token game, so it is
left out: a turn that only talks is a turn that repeats the standing state, which a proposal can
always do. This is the form a language model plays through the English text view
(games/text.py `NegotiationTextView`): one response per turn, "[propose: 2 books, 1 hat, 0 balls]"
or "[accept]".

Actions: 0 is DEAL (legal only while the partner's proposal stands); 1 + 25a + 5b + c proposes
to take a books, b hats and c balls (legal when each is at most the pool's count).

Observation of a seat (float32, length 6 + 5 * max_utterances): the pool counts (3) and the
seat's own values (3), then one row per utterance so far: [+1 if this seat said it, -1 if the
partner did; 1 if it was DEAL; the books, hats and balls the speaker asked for (zeros for DEAL)],
and zero rows for utterances not yet made.
"""

from __future__ import annotations

import itertools

import numpy as np

from ludus.games.core import GameError, GameSpec
from ludus.games.builtin.negotiation import (ITEMS, MAX_COUNT, NUM_ITEM_TYPES, TOTAL_VALUE, Context, context_from_seed,
                               deal_shares, validate_context)
from ludus.games.registry import GameEntry

DEAL = 0
PROPOSALS: tuple[tuple[int, int, int], ...] = tuple(itertools.product(range(MAX_COUNT + 1), repeat=NUM_ITEM_TYPES))
"""Action 1 + i asks for PROPOSALS[i] (books, hats, balls)."""
NUM_ACTIONS = 1 + len(PROPOSALS)
CONTEXT_WIDTH = 2 * NUM_ITEM_TYPES
ROW_WIDTH = 2 + NUM_ITEM_TYPES


def proposal_action(want) -> int:
    """The action that asks for `want` (books, hats, balls)."""
    want = tuple(int(n) for n in want)
    if len(want) != NUM_ITEM_TYPES or not all(0 <= n <= MAX_COUNT for n in want):
        raise GameError(f"a proposal asks for 0..{MAX_COUNT} of each of {', '.join(ITEMS)}, got {want}")
    return 1 + PROPOSALS.index(want)  # type: ignore[arg-type]


class NegotiationTurns:
    """The negotiation, one utterance per step (see the module docstring)."""

    def __init__(self, max_utterances: int = 6):
        if not 2 <= max_utterances <= 20:
            raise GameError(f"max_utterances must be 2..20, got {max_utterances}")
        self.max_utterances = max_utterances
        suffix = "" if max_utterances == 6 else f"(max_utterances={max_utterances})"
        self.spec = GameSpec(
            id=f"negotiation_turns{suffix}", num_players=2, num_actions=NUM_ACTIONS,
            observation_shape=(CONTEXT_WIDTH + ROW_WIDTH * max_utterances,), zero_sum=False, utility_sum=None,
            min_utility=0.0, max_utility=float(TOTAL_VALUE), max_length=max_utterances,
            has_chance=True, perfect_information=False, observation_low=-1.0, observation_high=float(TOTAL_VALUE))
        self._proposals = np.array(PROPOSALS, dtype=np.int64)
        self.reset(0)

    # -- Game protocol ----------------------------------------------------------------------

    def reset(self, seed: int) -> None:
        self.reset_context(context_from_seed(int(seed)))

    def reset_context(self, context: Context) -> None:
        """Start over a given context (evaluations replay the same contexts for every agent)."""
        validate_context(context)
        self._context = context
        self._history: list[int] = []
        self._standing: tuple[int, tuple[int, ...]] | None = None
        self._shares: np.ndarray | None = None
        self._over = False
        self._returns = np.zeros(2, dtype=np.float32)

    @property
    def speaker(self) -> int:
        return len(self._history) % 2

    def to_move(self) -> tuple[int, ...]:
        return () if self._over else (self.speaker,)

    def observation(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        obs = np.zeros(self.spec.observation_shape, dtype=np.float32)
        obs[:NUM_ITEM_TYPES] = self._context.counts
        obs[NUM_ITEM_TYPES:CONTEXT_WIDTH] = self._context.values[seat]
        for t, action in enumerate(self._history):
            row = obs[CONTEXT_WIDTH + ROW_WIDTH * t: CONTEXT_WIDTH + ROW_WIDTH * (t + 1)]
            row[0] = 1.0 if t % 2 == seat else -1.0
            if action == DEAL:
                row[1] = 1.0
            else:
                row[2:] = PROPOSALS[action - 1]
        return obs

    def legal_mask(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        mask = np.zeros(NUM_ACTIONS, dtype=bool)
        if self._over or seat != self.speaker:
            return mask
        mask[1:] = (self._proposals <= np.array(self._context.counts)).all(axis=1)
        mask[DEAL] = self._standing is not None and self._standing[0] != seat
        return mask

    def step(self, actions: dict[int, int]) -> np.ndarray:
        if self._over:
            raise GameError("the negotiation is over: reset it before stepping")
        speaker = self.speaker
        if set(actions) != {speaker}:
            raise GameError(f"seat {speaker} is to speak; got actions for seats {sorted(actions)}")
        action = int(actions[speaker])
        if not (0 <= action < NUM_ACTIONS and self.legal_mask(speaker)[action]):
            raise GameError(f"action {action} is not legal for seat {speaker} now: read legal_mask()")
        self._history.append(action)
        rewards = np.zeros(2, dtype=np.float32)
        if action == DEAL:
            self._shares, rewards = deal_shares(self._context, *self._standing)  # type: ignore[misc]
            self._returns += rewards
            self._over = True
        else:
            self._standing = (speaker, PROPOSALS[action - 1])
            self._over = len(self._history) >= self.max_utterances  # no deal: both get 0
        return rewards

    def is_terminal(self) -> bool:
        return self._over

    def is_truncated(self) -> bool:
        return False  # the utterance limit is a rule: its end is terminal, as in the token game

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        ctx = self._context
        lines = ["pool: " + spell_items(ctx.counts)]
        for seat in range(2):
            lines.append(f"seat {seat} values: " + ", ".join(f"{item} {v}" for item, v in zip(ITEMS, ctx.values[seat])))
        for t, action in enumerate(self._history):
            said = "deal" if action == DEAL else f"I want {spell_items(PROPOSALS[action - 1])}"
            lines.append(f"seat {t % 2}: {said}")
        if self._over:
            if self._shares is not None:
                lines.append(f"deal: seat 0 gets {spell_items(self._shares[0])}, seat 1 gets "
                             f"{spell_items(self._shares[1])}; scores {self._returns[0]:g}, {self._returns[1]:g}")
            else:
                lines.append("no deal: scores 0, 0")
        else:
            lines.append(f"seat {self.speaker} to speak (utterance {len(self._history) + 1} of {self.max_utterances})")
        return "\n".join(lines)

    # -- helpers ------------------------------------------------------------------------------

    def context(self) -> Context:
        return self._context

    def agreed(self) -> bool:
        return self._shares is not None

    def _check_seat(self, seat: int) -> None:
        if seat not in (0, 1):
            raise GameError(f"negotiation_turns has seats 0 and 1, got {seat}")


def spell_items(counts) -> str:
    """``2 books, 1 hat, 0 balls``."""
    return ", ".join(f"{int(n)} {item if int(n) == 1 else item + 's'}" for item, n in zip(ITEMS, counts))


NEGOTIATION_TURNS_ENTRY = GameEntry(
    "negotiation_turns", NegotiationTurns, None,
    "The negotiation played one utterance per step: propose a split or accept (the form an LM plays in English)",
    layout="observation: float32, 6 + 5 * max_utterances = 36 by default: pool counts of book, hat, ball; the "
           "seat's own values of each; then per utterance so far [1 if this seat said it, -1 if the partner did; "
           "1 if it was a deal; the books, hats, balls asked for], zero rows after.\n"
           "actions: 0 = deal (accept the partner's standing proposal); 1 + 25*books + 5*hats + balls = propose "
           "to take those items, the partner getting the rest.\n"
           "seat 0 speaks first; a deal pays each seat the value of its share; no deal after max_utterances pays 0.")
