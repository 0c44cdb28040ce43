"""The negotiation evaluation: two policies over held-out contexts.

`evaluate_negotiators` plays two policies over held-out contexts in duplicate (each context
twice, seats swapped) and reports agreement, both players' scores, joint score against the
random-split and best-split references, parseable-utterance rate and distinct utterances with
95% intervals; `score_gain` compares two evaluations context by context. The learner that the
negotiation preset trains is league/learners/dialogue.py (`lm_policy_of` turns it into a policy
to evaluate here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ludus.agents.policy import Policy


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% confidence interval."""

    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def mean_interval(values: np.ndarray) -> Interval:
    """Mean and normal-approximation 95% interval (mean +- 1.96 standard errors)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_interval of no values")
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size) if x.size > 1 else math.inf
    return Interval(float(x.mean()), float(x.mean() - half), float(x.mean() + half))


def rate_interval(successes: int, n: int) -> Interval:
    """A success rate with its Wilson 95% interval."""
    from ludus.league.stats import wilson_interval

    low, high = wilson_interval(successes, n)
    return Interval(successes / n if n else 0.0, low, high)


@dataclass(frozen=True)
class NegotiationEval:
    """Two policies A and B over the same contexts: games A-B (A in seat 0) and, in duplicate,
    B-A (the same contexts, seats swapped)."""

    contexts: tuple
    """The contexts played (ludus.games.builtin.negotiation.Context), in order."""
    records_ab: tuple
    """NegotiationRecord per context, A in seat 0 and B in seat 1."""
    records_ba: tuple
    """NegotiationRecord per context, B in seat 0 and A in seat 1 (empty unless duplicate)."""
    random_split_joint: float
    """Mean joint score of a uniformly random agreed split over these contexts (docs/reference.md §4: 10.0)."""
    best_joint: float
    """Mean best possible joint score over these contexts (docs/reference.md §4: 15.1)."""

    @property
    def duplicate(self) -> bool:
        return bool(self.records_ba)

    def _records(self) -> list:
        return list(self.records_ab) + list(self.records_ba)

    def own_scores(self, player: str, seat: int) -> np.ndarray:
        """[n] the score of `player` ('a' or 'b') when it sat in `seat`, per context."""
        if player not in ("a", "b") or seat not in (0, 1):
            raise ValueError(f"player is 'a' or 'b' and seat 0 or 1, got {player!r}, {seat}")
        records = self.records_ab if (player == "a") == (seat == 0) else self.records_ba
        if not records:
            raise ValueError(f"player {player!r} never sat in seat {seat}: evaluate with duplicate=True")
        return np.array([r.scores[seat] for r in records], dtype=np.float64)

    def score(self, player: str) -> Interval:
        """Mean own score of `player` over all its games."""
        seats = (0, 1) if self.duplicate else ((0,) if player == "a" else (1,))
        return mean_interval(np.concatenate([self.own_scores(player, s) for s in seats]))

    def score_by_seat(self, player: str, seat: int) -> Interval:
        return mean_interval(self.own_scores(player, seat))

    @property
    def agreement_rate(self) -> Interval:
        records = self._records()
        return rate_interval(sum(r.agreed for r in records), len(records))

    @property
    def joint(self) -> Interval:
        return mean_interval(np.array([sum(r.scores) for r in self._records()]))

    def _spoken(self, player: str) -> list[tuple[tuple[int, ...], tuple[int, int, int]]]:
        """(words, pool counts) of every utterance `player` said (seat 0 speaks first, then they alternate)."""
        out = []
        for records, seat in ((self.records_ab, 0 if player == "a" else 1),
                              (self.records_ba, 1 if player == "a" else 0)):
            for r in records:
                out += [(words, r.context.counts) for i, words in enumerate(r.utterances) if i % 2 == seat]
        return out

    def parseable_rate(self, player: str) -> Interval:
        """Share of `player`'s utterances that parse as a proposal or `deal` (either is parseable)."""
        from ludus.games.builtin.negotiation import UtteranceKind, parse_utterance

        spoken = self._spoken(player)
        parsed = sum(parse_utterance(words, counts).kind is not UtteranceKind.CHAT for words, counts in spoken)
        return rate_interval(parsed, len(spoken))

    def distinct_utterances(self, player: str) -> int:
        return len({words for words, _ in self._spoken(player)})

    def summary(self, name_a: str = "A", name_b: str = "B") -> str:
        lines = [f"{len(self.contexts)} contexts{' in duplicate' if self.duplicate else ''}: "
                 f"agreement {self.agreement_rate}, joint {self.joint} "
                 f"(random split {self.random_split_joint:.2f}, best {self.best_joint:.2f})"]
        for player, name in (("a", name_a), ("b", name_b)):
            seats = (0, 1) if self.duplicate else ((0,) if player == "a" else (1,))
            by_seat = ", ".join(f"seat {s} {self.score_by_seat(player, s)}" for s in seats)
            lines.append(f"  {name}: score {self.score(player)} ({by_seat}); parseable "
                         f"{self.parseable_rate(player)}; {self.distinct_utterances(player)} distinct utterances")
        return "\n".join(lines)


def play_contexts(seat_policies: Sequence[Policy], contexts: Sequence, rng: np.random.Generator,
                  greedy: bool = False, game_id: str = "negotiation") -> list:
    """Play one negotiation per context, seat_policies[s] in seat s, every step batching the rows
    of all games where a policy is to move into one `act` call. Returns the NegotiationRecords."""
    from ludus.games import registry

    games = []
    for context in contexts:
        game = registry.make(game_id)
        game.reset_context(context)
        games.append(game)
    from ludus.agents.bots.scripted_negotiator import play_turns

    return [g.record() for g in play_turns(games, seat_policies, rng, greedy)]


def held_out_contexts(num_contexts: int, seed: int = 2024) -> list:
    """Evaluation contexts from their own seed stream (training matches draw theirs from match seeds)."""
    from ludus.games.builtin.negotiation import sample_contexts

    return sample_contexts(num_contexts, int(np.random.SeedSequence([seed, 7]).generate_state(1, np.uint32)[0]))


def evaluate_negotiators(policy_a: Policy, policy_b: Policy, contexts: Sequence | int, duplicate: bool = True,
                         seed: int = 0, greedy: bool = False, game_id: str = "negotiation") -> NegotiationEval:
    """Play A against B on `contexts` (or that many `held_out_contexts`); with `duplicate` every
    context is played twice, seats swapped, so both see both sides of the same deal and per-context
    differences between two evaluations on the same contexts are paired (`score_gain`). Policies
    sample (seeded by `seed`) unless `greedy`."""
    from ludus.games.builtin.negotiation import reference_scores

    if isinstance(contexts, int):
        contexts = held_out_contexts(contexts)
    contexts = tuple(contexts)
    rng = np.random.default_rng(seed)
    ab = play_contexts([policy_a, policy_b], contexts, rng, greedy, game_id)
    ba = play_contexts([policy_b, policy_a], contexts, rng, greedy, game_id) if duplicate else []
    refs = reference_scores(contexts)
    return NegotiationEval(contexts, tuple(ab), tuple(ba), refs.random_split_joint, refs.best_joint)


def score_gain(new: NegotiationEval, base: NegotiationEval, seat: int, player: str = "a") -> Interval:
    """How much more `player` scores in `seat` in `new` than in `base`, paired over the same contexts."""
    if new.contexts != base.contexts:
        raise ValueError("score_gain compares evaluations over the same contexts")
    return mean_interval(new.own_scores(player, seat) - base.own_scores(player, seat))
