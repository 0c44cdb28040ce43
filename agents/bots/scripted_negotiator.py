"""Scripted negotiators for the `negotiation` game: fixed reference opponents and imitation data.

The bots act from the observation only (`ludus.games.builtin.negotiation.parse_observation`). Each plans its
whole utterance from the context and the *finished* utterances, so re-planning at every token
gives the same plan, and emits the next token of it (`<eou>` last). They are batched over rows
like every `Policy` (a Python loop: the bots are references, not the hot path).

* `GreedyFairNegotiator` (Lewis et al. 2017 use a similar rule-based partner): accepts the
  partner's standing proposal when it is worth at least `accept_threshold` to it (or anything
  positive on the last utterance), else proposes the most generous split that still meets its
  aspiration, which starts at `opening` and falls by `concession` per own proposal down to the
  threshold (time-dependent concession, Faratin et al. 1998). It reads the partner's values off
  its requests: offers leave the partner an item type it asked for, and among equally good
  splits the one closest to the partner's latest request wins (`choose_share`).
* `RandomSplitNegotiator`: accepts any partner proposal, else proposes a uniformly random split;
  against itself it realises the "random split" reference (joint score 10.0).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ludus.agents.policy import ActBatch, ActOutput, Policy, zero_output
from ludus.games.builtin.negotiation import (
    DEAL_ID, DIGIT_IDS, EOU_ID, I_ID, ITEM_IDS, NUM_ITEM_TYPES, WANT_ID, Negotiation, NegotiationRecord,
    NegotiationRules, ObservationView, UtteranceKind, own_token_mask, parse_observation, parse_utterance,
    proposal_tokens)


@dataclass(frozen=True)
class NegotiatorConfig:
    """Behaviour of a `GreedyFairNegotiator`."""

    accept_threshold: int = 5
    """Accept the partner's proposal when its share is worth at least this much to the bot."""
    opening: int = 8
    """Own score the first proposal asks for (at least)."""
    concession: int = 1
    """How much the asked-for score drops with each further own proposal (never below the threshold)."""
    accept_last_chance: bool = True
    """On the dialogue's last utterance accept any offer worth more than 0 (no deal pays 0)."""
    min_partner_items: int = 1
    """Proposals leave the partner at least this many items."""
    max_utterances: int = 6
    """The game's `max_utterances` (to know which utterance is the last)."""


GREEDY_FAIR = NegotiatorConfig()
"""The default anchor: opens at 8, concedes 1 per proposal to 5, accepts 5 or more."""
TOUGH = NegotiatorConfig(accept_threshold=7, opening=10, concession=1)
"""Asks for everything it values, accepts 7 or more."""
SOFT = NegotiatorConfig(accept_threshold=3, opening=6, concession=1)
"""Opens at 6, accepts 3 or more."""


@functools.lru_cache(maxsize=None)
def _splits(counts: tuple[int, ...]) -> np.ndarray:
    """[S, 3] every share a seat can ask for in a pool (read-only; cached: there are only 28 pools)."""
    grids = np.meshgrid(*[np.arange(c + 1) for c in counts], indexing="ij")
    shares = np.stack([g.ravel() for g in grids], axis=1).astype(np.int64)
    shares.setflags(write=False)
    return shares


def _partner_requests(view: ObservationView) -> list[np.ndarray]:
    """What the partner asked for in each of its proposals so far, oldest first."""
    requests = []
    for u in view.finished():
        if not u.mine:
            parsed = parse_utterance(u.words, view.counts)
            if parsed.kind is UtteranceKind.PROPOSAL:
                requests.append(np.array(parsed.want, dtype=np.int64))
    return requests


def _check_and_pack(actions: list[int], batch: ActBatch) -> ActOutput:
    chosen = np.array(actions, dtype=np.int64)
    if not np.all(batch.mask[np.arange(len(chosen)), chosen]):
        raise ValueError("scripted negotiator planned an illegal token: is this a negotiation game "
                         "with max_utterance_tokens >= 8?")
    return zero_output(chosen)


class GreedyFairNegotiator:
    """Deterministic rule-based negotiator (see the module docstring)."""

    needs_history = False

    def __init__(self, config: NegotiatorConfig = GREEDY_FAIR):
        self.config = config
        # The plan depends only on the context and the finished utterances, so the tokens after an
        # utterance's first are cache hits (a 5x speed-up when generating imitation data).
        self._plans: dict[tuple, tuple[int, ...]] = {}

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        actions = []
        for obs in batch.obs:
            view = parse_observation(obs)
            key = (view.counts, view.values, view.finished())
            plan = self._plans.get(key)
            if plan is None:
                if len(self._plans) >= 4096:
                    self._plans.clear()
                plan = self._plans[key] = tuple(self.plan(view))
            actions.append(plan[len(view.current())])
        return _check_and_pack(actions, batch)

    def plan(self, view: ObservationView) -> list[int]:
        """The whole utterance (word ids then `<eou>`) the bot says at this point of the dialogue."""
        cfg = self.config
        counts = np.array(view.counts, dtype=np.int64)
        values = np.array(view.values, dtype=np.int64)
        finished = view.finished()
        standing = view.standing_offer()
        if standing is not None and not standing[0]:
            own = int(values @ (counts - np.array(standing[1])))
            last = len(finished) >= cfg.max_utterances - 1
            if own >= cfg.accept_threshold or (last and cfg.accept_last_chance and own > 0):
                return [DEAL_ID, EOU_ID]
        proposals_made = sum(u.mine for u in finished)
        aspiration = max(cfg.accept_threshold, cfg.opening - cfg.concession * proposals_made)
        return proposal_tokens(self.choose_share(counts, values, aspiration, _partner_requests(view))) + [EOU_ID]

    def choose_share(self, counts: np.ndarray, values: np.ndarray, aspiration: int,
                     partner_requests: Sequence[np.ndarray]) -> np.ndarray:
        """The share to ask for, among those worth >= aspiration to the bot (or the best it can get):

        1. leave the partner some item type it has asked for (its requests reveal what it values;
           an offer worth 0 to the partner is refused even on the last utterance);
        2. the lowest own score (the most generous split that meets the aspiration);
        3. keep the fewest items worth 0 to the bot (they cost nothing to give away);
        4. closest to the partner's latest request;
        5. leave the partner the most items; the share itself breaks remaining ties.
        """
        shares = _splits(tuple(int(c) for c in counts))
        partner_share = counts - shares
        shares = shares[partner_share.sum(axis=1) >= min(self.config.min_partner_items, int(counts.sum()))]
        own = shares @ values
        keep = own >= aspiration if np.any(own >= aspiration) else own == own.max()
        shares, own = shares[keep], own[keep]
        partner_share = counts - shares
        if partner_requests:
            requested = np.any(np.stack(partner_requests) > 0, axis=0)
            misses_requests = ~np.any((partner_share > 0) & requested, axis=1)
            distance = np.abs(partner_share - partner_requests[-1]).sum(axis=1)
        else:
            misses_requests = np.zeros(len(shares), dtype=bool)
            distance = np.zeros(len(shares), dtype=np.int64)
        worthless_kept = (shares * (values == 0)).sum(axis=1)
        # np.lexsort sorts by the last key first.
        order = np.lexsort((shares[:, 2], shares[:, 1], shares[:, 0], -partner_share.sum(axis=1), distance,
                            worthless_kept, own, misses_requests))
        return shares[order[0]]


class RandomSplitNegotiator:
    """Accepts any partner proposal; otherwise proposes a uniformly random split."""

    needs_history = False

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        actions = []
        for obs in batch.obs:
            view = parse_observation(obs)
            standing = view.standing_offer()
            current = view.current()
            if standing is not None and not standing[0]:
                actions.append([DEAL_ID, EOU_ID][len(current)])
                continue
            # i want <n> book <n> hat <n> ball <eou>: the digit at position 2+2k is drawn when it is
            # due (uniform in 0..count), so the split is uniform and the plan needs no memory.
            position = len(current)
            if position == 0:
                actions.append(I_ID)
            elif position == 1:
                actions.append(WANT_ID)
            elif position < 2 + 2 * NUM_ITEM_TYPES:
                k = (position - 2) // 2
                actions.append(DIGIT_IDS[int(rng.integers(view.counts[k] + 1))] if position % 2 == 0
                               else ITEM_IDS[k])
            else:
                actions.append(EOU_ID)
        return _check_and_pack(actions, batch)


# ---------------------------------------------------------------------------------------------
# Playing bots against each other; imitation data


def play_negotiations(bots: Sequence[Policy], seeds: Sequence[int], rng: np.random.Generator,
                      rules: NegotiationRules = NegotiationRules(), greedy: bool = False) -> list[Negotiation]:
    """Play one negotiation per seed, bots[0] in seat 0 and bots[1] in seat 1; each step batches the
    rows of every game where a bot is to move into one `act` call. Returns the finished games."""
    if len(bots) != 2:
        raise ValueError(f"a negotiation needs 2 bots, got {len(bots)}")
    games = []
    for seed in seeds:
        game = Negotiation(rules.max_utterances, rules.max_utterance_tokens)
        game.reset(int(seed))
        games.append(game)
    return play_turns(games, bots, rng, greedy)


def play_turns(games: list, seat_policies: Sequence[Policy], rng: np.random.Generator, greedy: bool = False) -> list:
    """Play turn-based games (one seat to move at a time) to the end, `seat_policies[s]` in seat s;
    each step batches the rows of every game where seat s is to move into one `act` call."""
    while True:
        running = [g for g in games if g.to_move()]
        if not running:
            return games
        for seat, policy in enumerate(seat_policies):
            movers = [g for g in running if g.to_move() == (seat,)]
            if not movers:
                continue
            batch = ActBatch(obs=np.stack([g.observation(seat) for g in movers]),
                             mask=np.stack([g.legal_mask(seat) for g in movers]),
                             seats=np.full(len(movers), seat, dtype=np.int64),
                             histories=[g.history() for g in movers] if policy.needs_history else None)
            out = policy.act(batch, rng, greedy=greedy)
            for game, action in zip(movers, out.actions):
                game.step({seat: int(action)})


@dataclass(frozen=True)
class SeatTranscript:
    """One seat's view of a finished dialogue, ready for next-token imitation."""

    tokens: np.ndarray
    """[L] int64 the seat's final observation: context, then the dialogue with YOU:/THEM: markers."""
    targets: np.ndarray
    """[L] bool positions of tokens this seat emitted; token i was chosen seeing tokens[:i]."""
    legal: np.ndarray
    """[L, V] bool the legal tokens when the seat chose token i (all False at non-target positions);
    the mask a next-token model must be normalised over to match the game."""


@dataclass(frozen=True)
class DialogueSample:
    seed: int
    """Reset seed of the game (its context)."""
    history: tuple[int, ...]
    """Token ids in the order they were played."""
    seats: tuple[SeatTranscript, SeatTranscript]
    record: NegotiationRecord


def generate_dialogues(num_dialogues: int, seed: int, bots: Sequence[Policy],
                       rules: NegotiationRules = NegotiationRules()) -> list[DialogueSample]:
    """`num_dialogues` games of bots[0] (seat 0) against bots[1] (seat 1), contexts and bot
    randomness drawn from `seed`, as per-seat token sequences with imitation target masks."""
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, 2**63 - 1, size=num_dialogues)
    games = play_negotiations(bots, seeds, rng, rules)
    samples = []
    for game_seed, game in zip(seeds, games):
        # Replay the game to read the legal mask at each emitted token's position.
        replay = Negotiation(rules.max_utterances, rules.max_utterance_tokens)
        replay.reset(int(game_seed))
        legal = np.zeros((2, replay.spec.observation_shape[0], replay.spec.num_actions), dtype=bool)
        for token in game.history():
            seat = replay.to_move()[0]
            legal[seat, np.count_nonzero(replay.observation(seat))] = replay.legal_mask(seat)
            replay.step({seat: token})
        seats = []
        for seat in range(2):
            obs = game.observation(seat)
            seats.append(SeatTranscript(obs, own_token_mask(obs), legal[seat]))
        samples.append(DialogueSample(int(game_seed), game.history(), tuple(seats), game.record()))  # type: ignore[arg-type]
    return samples
