"""`negotiation`: a cut-down "Deal or No Deal" (Lewis et al. 2017, "Deal or No Deal? End-to-End
Learning for Negotiation Dialogues"), played one word token per step.

Context (drawn from the reset seed): a pool of 3 item types (book, hat, ball), 1-4 of each and
5-7 items in total; each seat has private integer values 0-10 per item with values . counts = 10.
As in Lewis et al. (section 2.1), every item is worth something to at least one seat and some
item is worth something to both (contexts violating this are redrawn). With this distribution
over 20k contexts: a random split gives joint score 10.0, the best split 15.1, the max-min
("fair") split 6.67 each (`reference_scores`; docs/reference.md §4).

Dialogue: seat 0 speaks first; seats alternate utterances of 1 to `max_utterance_tokens` words,
each closed by `<eou>` (at the word cap `<eou>` is the only legal token), at most
`max_utterances` utterances in all. A deterministic parser reads each finished utterance:

* ``i want <n> book <n> hat <n> ball`` with every n <= the pool count is a PROPOSAL: the speaker
  asks for those items, the partner gets the rest; it becomes the standing offer.
* exactly ``deal`` while the standing offer is the partner's ends the game with that split.
* anything else (including ``deal`` with no partner offer standing, and proposals asking for
  more than the pool holds) is CHAT and changes nothing.

Agreement pays each seat the value of its own share; running out of utterances pays 0 to both
(a terminal state by the rules, not a truncation). Not zero-sum; the higher own score wins for
ratings (`ludus.games.dialogue.dialogue_outcome`).

Observation of a seat (int64 token ids, length 9 + max_utterances * (max_utterance_tokens + 2)):
``book <count> v<value> hat <count> v<value> ball <count> v<value>`` (its own values; counts use
the digit tokens of speech) followed by the dialogue so far, each utterance opened by `YOU:` or
`THEM:` as seen by that seat and closed by `<eou>`, right-padded with `<pad>`. The marker of an
utterance is written when it starts, so the speaker's observation ends in ``YOU: <words so far>``
and the whole observation is a causal language-model prefix of the next token.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ludus.games import dialogue
from ludus.games.core import GameError, GameSpec
from ludus.games.dialogue import EOU, PAD, UNK, Vocabulary
from ludus.games.registry import GameEntry

ITEMS: tuple[str, ...] = ("book", "hat", "ball")
NUM_ITEM_TYPES = len(ITEMS)
MAX_COUNT = 4
"""Each item type appears 1..MAX_COUNT times in the pool."""
MIN_TOTAL_ITEMS, MAX_TOTAL_ITEMS = 5, 7
TOTAL_VALUE = 10
"""Every seat's values . counts equals this, so scores lie in 0..10."""
CONTEXT_LENGTH = 3 * NUM_ITEM_TYPES
"""Observation tokens before the dialogue: (item, count, value) per item type."""

YOU, THEM = "YOU:", "THEM:"
DIGITS: tuple[str, ...] = tuple(str(n) for n in range(MAX_COUNT + 1))
VALUE_TOKENS: tuple[str, ...] = tuple(f"v{n}" for n in range(TOTAL_VALUE + 1))
CHAT_WORDS: tuple[str, ...] = ("you", "get", "the", "rest", "ok", "how", "about")

VOCAB = Vocabulary(
    words=(PAD, YOU, THEM, *VALUE_TOKENS, EOU, "i", "want", *DIGITS, *ITEMS, "deal", "no", *CHAT_WORDS, UNK),
    special=frozenset({PAD, YOU, THEM, *VALUE_TOKENS}),
)
PAD_ID, YOU_ID, THEM_ID, EOU_ID = VOCAB.id(PAD), VOCAB.id(YOU), VOCAB.id(THEM), VOCAB.id(EOU)
I_ID, WANT_ID, DEAL_ID = VOCAB.id("i"), VOCAB.id("want"), VOCAB.id("deal")
DIGIT_IDS: tuple[int, ...] = tuple(VOCAB.ids(DIGITS))
ITEM_IDS: tuple[int, ...] = tuple(VOCAB.ids(ITEMS))
VALUE_IDS: tuple[int, ...] = tuple(VOCAB.ids(VALUE_TOKENS))


# ---------------------------------------------------------------------------------------------
# Contexts


@dataclass(frozen=True)
class Context:
    """One negotiation's private information."""

    counts: tuple[int, int, int]
    """Items of each type in the pool (book, hat, ball)."""
    values: tuple[tuple[int, int, int], tuple[int, int, int]]
    """values[seat][item]: what one item of that type is worth to the seat."""

    def score(self, seat: int, share: Sequence[int]) -> int:
        """Value of `share` (items per type) to `seat`."""
        return int(np.dot(self.values[seat], share))


def deal_shares(context: Context, proposer: int, want: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The deal of `proposer`'s standing proposal `want`: [2, 3] items per seat (the proposer gets
    `want`, the partner the rest) and [2] float32 the seats' scores (the value of their shares)."""
    shares = np.zeros((2, NUM_ITEM_TYPES), dtype=np.int64)
    shares[proposer] = want
    shares[1 - proposer] = np.array(context.counts) - np.array(want)
    return shares, (np.array(context.values, dtype=np.int64) * shares).sum(axis=1).astype(np.float32)


def _valid_counts() -> np.ndarray:
    return np.array([c for c in itertools.product(range(1, MAX_COUNT + 1), repeat=NUM_ITEM_TYPES)
                     if MIN_TOTAL_ITEMS <= sum(c) <= MAX_TOTAL_ITEMS], dtype=np.int64)


VALID_COUNTS = _valid_counts()
"""[M, 3] every pool allowed by the rules, drawn uniformly."""
# Value vectors v >= 0 with v . counts = 10, per pool (a value of at most 10 follows from the sum).
_VALUE_VECTORS: tuple[np.ndarray, ...] = tuple(
    np.array([v for v in itertools.product(range(TOTAL_VALUE + 1), repeat=NUM_ITEM_TYPES)
              if int(np.dot(v, counts)) == TOTAL_VALUE], dtype=np.int64)
    for counts in VALID_COUNTS)


def sample_context(rng: np.random.Generator) -> Context:
    """A pool uniform over VALID_COUNTS and, per seat, values uniform over the vectors summing to 10;
    redrawn until every item type is worth something to someone and some type to both (Lewis et al.)."""
    while True:
        pool = int(rng.integers(len(VALID_COUNTS)))
        vectors = _VALUE_VECTORS[pool]
        a = vectors[rng.integers(len(vectors))]
        b = vectors[rng.integers(len(vectors))]
        if np.any((a == 0) & (b == 0)) or not np.any((a > 0) & (b > 0)):
            continue
        return Context(tuple(int(c) for c in VALID_COUNTS[pool]),  # type: ignore[arg-type]
                       (tuple(int(x) for x in a), tuple(int(x) for x in b)))  # type: ignore[arg-type]


def validate_context(context: Context) -> None:
    """Raise GameError unless `context` is one `sample_context` can draw."""
    counts = np.array(context.counts)
    values = np.array(context.values)
    if counts.shape != (NUM_ITEM_TYPES,) or values.shape != (2, NUM_ITEM_TYPES):
        raise GameError(f"a context has {NUM_ITEM_TYPES} counts and 2x{NUM_ITEM_TYPES} values, got {context}")
    if np.any(counts < 1) or np.any(counts > MAX_COUNT) or not MIN_TOTAL_ITEMS <= counts.sum() <= MAX_TOTAL_ITEMS:
        raise GameError(f"counts {context.counts} must be 1..{MAX_COUNT} each, "
                        f"{MIN_TOTAL_ITEMS}..{MAX_TOTAL_ITEMS} in total")
    if np.any(values < 0) or np.any(values @ counts != TOTAL_VALUE):
        raise GameError(f"values {context.values} must be >= 0 with values . counts = {TOTAL_VALUE} per seat")
    if np.any((values[0] == 0) & (values[1] == 0)) or not np.any((values[0] > 0) & (values[1] > 0)):
        raise GameError(f"values {context.values}: every item must be worth something to a seat and "
                        f"some item to both")


def context_from_seed(seed: int) -> Context:
    """The context `Negotiation.reset(seed)` plays."""
    if seed < 0:
        raise GameError(f"game seeds are non-negative integers, got {seed}")
    return sample_context(np.random.default_rng(seed))


def sample_contexts(num_contexts: int, seed: int) -> list[Context]:
    rng = np.random.default_rng(seed)
    return [sample_context(rng) for _ in range(num_contexts)]


# ---------------------------------------------------------------------------------------------
# The parser


class UtteranceKind(enum.Enum):
    PROPOSAL = "proposal"
    DEAL = "deal"
    CHAT = "chat"


@dataclass(frozen=True)
class ParsedUtterance:
    kind: UtteranceKind
    want: tuple[int, int, int] | None = None
    """For a proposal: the items per type the speaker asks for."""


PROPOSAL_LENGTH = 2 + 2 * NUM_ITEM_TYPES
"""Words in ``i want <n> book <n> hat <n> ball``."""


def parse_utterance(words: Sequence[int], counts: Sequence[int]) -> ParsedUtterance:
    """Read one utterance (word token ids, without `<eou>`) against the pool `counts`."""
    words = [int(w) for w in words]
    if words == [DEAL_ID]:
        return ParsedUtterance(UtteranceKind.DEAL)
    if len(words) == PROPOSAL_LENGTH and words[0] == I_ID and words[1] == WANT_ID:
        want = []
        for k in range(NUM_ITEM_TYPES):
            digit, item = words[2 + 2 * k], words[3 + 2 * k]
            if digit not in DIGIT_IDS or item != ITEM_IDS[k]:
                return ParsedUtterance(UtteranceKind.CHAT)
            n = DIGIT_IDS.index(digit)
            if n > counts[k]:
                return ParsedUtterance(UtteranceKind.CHAT)
            want.append(n)
        return ParsedUtterance(UtteranceKind.PROPOSAL, tuple(want))  # type: ignore[arg-type]
    return ParsedUtterance(UtteranceKind.CHAT)


def proposal_tokens(want: Sequence[int]) -> list[int]:
    """``i want <n> book <n> hat <n> ball`` as token ids (without `<eou>`)."""
    tokens = [I_ID, WANT_ID]
    for k, n in enumerate(want):
        tokens += [DIGIT_IDS[int(n)], ITEM_IDS[k]]
    return tokens


@dataclass(frozen=True)
class Utterance:
    """A finished utterance of a game."""

    speaker: int
    words: tuple[int, ...]
    """Word token ids, without `<eou>`."""
    parsed: ParsedUtterance


# ---------------------------------------------------------------------------------------------
# The game


@dataclass(frozen=True)
class NegotiationRules:
    """The length limits of a negotiation (the registry parameters of `negotiation(...)`)."""

    max_utterances: int = 6
    """Utterances in the whole dialogue (both seats) before it ends without agreement."""
    max_utterance_tokens: int = 8
    """Words per utterance, not counting `<eou>`; at least 8 so that a proposal fits."""

    def __post_init__(self) -> None:
        if not 2 <= self.max_utterances <= 64:
            raise GameError(f"max_utterances must be 2..64 (a deal needs a proposal and a reply), "
                            f"got {self.max_utterances}")
        if not PROPOSAL_LENGTH <= self.max_utterance_tokens <= 64:
            raise GameError(f"max_utterance_tokens must be {PROPOSAL_LENGTH}..64 (a proposal "
                            f"'i want 1 book 1 hat 1 ball' has {PROPOSAL_LENGTH} words), "
                            f"got {self.max_utterance_tokens}")

    @property
    def dialogue_capacity(self) -> int:
        """Observation slots for the dialogue: marker + words + `<eou>` per utterance."""
        return self.max_utterances * (self.max_utterance_tokens + 2)

    @property
    def observation_length(self) -> int:
        return CONTEXT_LENGTH + self.dialogue_capacity

    @property
    def game_id(self) -> str:
        defaults = NegotiationRules()
        params = [f"{name}={getattr(self, name)}" for name in ("max_utterances", "max_utterance_tokens")
                  if getattr(self, name) != getattr(defaults, name)]
        return f"negotiation({','.join(params)})" if params else "negotiation"


def context_tokens(context: Context, seat: int) -> np.ndarray:
    """The observation prefix of `seat`: item, count, own value per item type."""
    tokens = []
    for k in range(NUM_ITEM_TYPES):
        tokens += [ITEM_IDS[k], DIGIT_IDS[context.counts[k]], VALUE_IDS[context.values[seat][k]]]
    return np.array(tokens, dtype=np.int64)


@dataclass(frozen=True)
class NegotiationRecord:
    """Everything measured about one finished negotiation."""

    context: Context
    agreed: bool
    scores: tuple[float, float]
    """Final return of each seat."""
    shares: tuple[tuple[int, int, int], tuple[int, int, int]] | None
    """Items per type each seat got, when agreed."""
    utterances: tuple[tuple[int, ...], ...]
    """Word token ids of each utterance, in order."""
    parseable_utterances: int
    """Utterances the parser read as a proposal or `deal`."""

    @property
    def num_utterances(self) -> int:
        return len(self.utterances)


class Negotiation:
    """The negotiation game; see the module docstring for the rules."""

    vocab = VOCAB

    def __init__(self, max_utterances: int = 6, max_utterance_tokens: int = 8):
        self.rules = NegotiationRules(max_utterances, max_utterance_tokens)
        self.max_utterance_tokens = max_utterance_tokens
        self.spec = GameSpec(
            id=self.rules.game_id, num_players=2, num_actions=len(VOCAB),
            observation_shape=(self.rules.observation_length,), zero_sum=False, utility_sum=None,
            min_utility=0.0, max_utility=float(TOTAL_VALUE),
            # every utterance ends by <eou> at the latest after max_utterance_tokens words
            max_length=max_utterances * (max_utterance_tokens + 1),
            has_chance=True, perfect_information=False, observation_dtype="int64",
            observation_low=0.0, observation_high=float(len(VOCAB) - 1))
        speakable = VOCAB.speakable_mask
        self._mask_first = speakable.copy()
        self._mask_first[EOU_ID] = False  # no empty utterances
        self._mask_middle = speakable.copy()
        self._mask_at_cap = np.zeros(len(VOCAB), dtype=bool)
        self._mask_at_cap[EOU_ID] = True
        self._no_moves = np.zeros(len(VOCAB), dtype=bool)
        self.reset(0)

    # -- Game protocol ----------------------------------------------------------------------

    def reset(self, seed: int) -> None:
        self.reset_context(context_from_seed(int(seed)))

    def reset_context(self, context: Context) -> None:
        """Start a negotiation over a given context (tests, replaying the same contexts for every
        agent in an evaluation)."""
        validate_context(context)
        self._context = context
        self._context_tokens = [context_tokens(self._context, seat) for seat in range(2)]
        self._history: list[int] = []
        # The dialogue stream; marker slots hold the speaking seat in _marker_seat (else -1).
        self._stream = np.zeros(self.rules.dialogue_capacity, dtype=np.int64)
        self._marker_seat = np.full(self.rules.dialogue_capacity, -1, dtype=np.int64)
        self._stream_length = 0
        self._utterances: list[Utterance] = []
        self._current: list[int] = []
        self._speaker = 0
        self._standing: tuple[int, tuple[int, int, int]] | None = None
        self._shares: np.ndarray | None = None
        self._over = False
        self._returns = np.zeros(2, dtype=np.float32)
        self._open_utterance()

    def to_move(self) -> tuple[int, ...]:
        return () if self._over else (self._speaker,)

    def observation(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        obs = np.full(self.rules.observation_length, PAD_ID, dtype=np.int64)
        obs[:CONTEXT_LENGTH] = self._context_tokens[seat]
        n = self._stream_length
        stream = self._stream[:n].copy()
        markers = self._marker_seat[:n]
        stream[markers == seat] = YOU_ID
        stream[(markers >= 0) & (markers != seat)] = THEM_ID
        obs[CONTEXT_LENGTH:CONTEXT_LENGTH + n] = stream
        return obs

    def legal_mask(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        if self._over or seat != self._speaker:
            return self._no_moves.copy()
        if not self._current:
            return self._mask_first.copy()
        if len(self._current) >= self.max_utterance_tokens:
            return self._mask_at_cap.copy()
        return self._mask_middle.copy()

    def step(self, actions: dict[int, int]) -> np.ndarray:
        if self._over:
            raise GameError("the negotiation is over: reset it before stepping")
        if set(actions) != {self._speaker}:
            raise GameError(f"seat {self._speaker} is to speak; got actions for seats {sorted(actions)}")
        token = int(actions[self._speaker])
        if not (0 <= token < len(VOCAB) and self.legal_mask(self._speaker)[token]):
            word = VOCAB.words[token] if 0 <= token < len(VOCAB) else "?"
            raise GameError(f"token {token} ({word!r}) is not legal for seat {self._speaker} now: "
                            f"read legal_mask()")
        self._history.append(token)
        self._push(token, -1)
        rewards = np.zeros(2, dtype=np.float32)
        if token != EOU_ID:
            self._current.append(token)
            return rewards
        return self._finish_utterance()

    def is_terminal(self) -> bool:
        return self._over

    def is_truncated(self) -> bool:
        return False  # the utterance limit is a rule of the game: its end is terminal

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        ctx = self._context
        lines = ["pool: " + ", ".join(f"{n} {item}" for item, n in zip(ITEMS, ctx.counts))]
        for seat in range(2):
            lines.append(f"seat {seat} values: " + ", ".join(
                f"{item} {v}" for item, v in zip(ITEMS, ctx.values[seat])))
        for u in self._utterances:
            lines.append(f"seat {u.speaker}: {dialogue.decode(VOCAB, u.words)} <eou>   [{u.parsed.kind.value}]")
        if self._current:
            lines.append(f"seat {self._speaker}: {dialogue.decode(VOCAB, self._current)} ...")
        if self._over:
            if self._shares is not None:
                got = "; ".join(f"seat {s} gets " + ", ".join(f"{n} {item}" for item, n in zip(ITEMS, self._shares[s]))
                                for s in range(2))
                lines.append(f"deal: {got}; scores {self._returns[0]:g}, {self._returns[1]:g}")
            else:
                lines.append("no deal: scores 0, 0")
        else:
            lines.append(f"seat {self._speaker} to speak "
                         f"(utterance {len(self._utterances) + 1} of {self.rules.max_utterances})")
        return "\n".join(lines)

    # -- dialogue helpers ---------------------------------------------------------------------

    def utterance_length(self) -> int:
        """Words the seat to move has said so far in its current utterance."""
        return len(self._current)

    def context(self) -> Context:
        return self._context

    def agreed(self) -> bool:
        return self._shares is not None

    def shares(self) -> np.ndarray | None:
        """[2, 3] items per type each seat got, once agreed; None otherwise."""
        return None if self._shares is None else self._shares.copy()

    def utterances(self) -> tuple[Utterance, ...]:
        return tuple(self._utterances)

    def num_utterances(self) -> int:
        return len(self._utterances)

    def parseable_utterances(self) -> int:
        return sum(u.parsed.kind is not UtteranceKind.CHAT for u in self._utterances)

    def record(self) -> NegotiationRecord:
        """The measurements of this game (call once it is over)."""
        shares = None
        if self._shares is not None:
            shares = tuple(tuple(int(n) for n in row) for row in self._shares)
        return NegotiationRecord(
            context=self._context, agreed=self.agreed(),
            scores=(float(self._returns[0]), float(self._returns[1])),
            shares=shares,  # type: ignore[arg-type]
            utterances=tuple(u.words for u in self._utterances),
            parseable_utterances=self.parseable_utterances())

    # -- internals ------------------------------------------------------------------------------

    def _check_seat(self, seat: int) -> None:
        if seat not in (0, 1):
            raise GameError(f"negotiation has seats 0 and 1, got {seat}")

    def _push(self, token: int, marker_seat: int) -> None:
        self._stream[self._stream_length] = token
        self._marker_seat[self._stream_length] = marker_seat
        self._stream_length += 1

    def _open_utterance(self) -> None:
        self._push(YOU_ID, self._speaker)

    def _finish_utterance(self) -> np.ndarray:
        speaker = self._speaker
        parsed = parse_utterance(self._current, self._context.counts)
        self._utterances.append(Utterance(speaker, tuple(self._current), parsed))
        self._current = []
        rewards = np.zeros(2, dtype=np.float32)
        if parsed.kind is UtteranceKind.PROPOSAL:
            self._standing = (speaker, parsed.want)  # type: ignore[assignment]
        elif parsed.kind is UtteranceKind.DEAL and self._standing is not None and self._standing[0] != speaker:
            self._shares, rewards = deal_shares(self._context, *self._standing)
            self._returns += rewards
            self._over = True
            return rewards
        if len(self._utterances) >= self.rules.max_utterances:
            self._over = True  # out of utterances: no deal, both get 0
            return rewards
        self._speaker = 1 - speaker
        self._open_utterance()
        return rewards


# ---------------------------------------------------------------------------------------------
# Observations, read back (scripted bots, imitation data)


@dataclass(frozen=True)
class ViewUtterance:
    mine: bool
    """Spoken by the observing seat."""
    words: tuple[int, ...]
    """Word token ids (without `<eou>`)."""
    finished: bool
    """Closed by `<eou>` (only the last utterance can be unfinished)."""


@dataclass(frozen=True)
class ObservationView:
    """A negotiation observation as fields."""

    counts: tuple[int, int, int]
    values: tuple[int, int, int]
    """The observing seat's own values."""
    utterances: tuple[ViewUtterance, ...]

    def finished(self) -> tuple[ViewUtterance, ...]:
        return tuple(u for u in self.utterances if u.finished)

    def current(self) -> tuple[int, ...]:
        """Words of the utterance in progress (the seat's own when it is to move)."""
        if self.utterances and not self.utterances[-1].finished:
            return self.utterances[-1].words
        return ()

    def standing_offer(self) -> tuple[bool, tuple[int, int, int]] | None:
        """(made by me?, what its proposer wants) of the latest proposal, or None."""
        for u in reversed(self.finished()):
            parsed = parse_utterance(u.words, self.counts)
            if parsed.kind is UtteranceKind.PROPOSAL:
                return u.mine, parsed.want  # type: ignore[return-value]
        return None


def parse_observation(obs: np.ndarray) -> ObservationView:
    """Invert `Negotiation.observation` (works for any rules: the dialogue ends at the padding)."""
    tokens = np.asarray(obs, dtype=np.int64).tolist()
    counts, values = [], []
    for k in range(NUM_ITEM_TYPES):
        item, count, value = tokens[3 * k: 3 * k + 3]
        if item != ITEM_IDS[k] or count not in DIGIT_IDS or value not in VALUE_IDS:
            raise GameError("not a negotiation observation: the context prefix is malformed")
        counts.append(DIGIT_IDS.index(count))
        values.append(VALUE_IDS.index(value))
    utterances: list[ViewUtterance] = []
    mine, words, open_ = False, [], False
    for token in tokens[CONTEXT_LENGTH:]:
        if token == PAD_ID:
            break
        if token in (YOU_ID, THEM_ID):
            mine, words, open_ = token == YOU_ID, [], True
        elif token == EOU_ID:
            utterances.append(ViewUtterance(mine, tuple(words), True))
            open_ = False
        else:
            words.append(token)
    if open_:
        utterances.append(ViewUtterance(mine, tuple(words), False))
    return ObservationView(tuple(counts), tuple(values), tuple(utterances))  # type: ignore[arg-type]


def own_token_mask(obs: np.ndarray) -> np.ndarray:
    """[L] bool: positions of `obs` holding tokens the observing seat emitted itself (words and
    `<eou>` after a `YOU:` marker). These are the targets of imitation and token-level RL; the
    partner's tokens, markers and context are observations only."""
    tokens = np.asarray(obs, dtype=np.int64)
    mask = np.zeros(tokens.shape, dtype=bool)
    inside = False
    for i in range(CONTEXT_LENGTH, len(tokens)):
        token = int(tokens[i])
        if token in (YOU_ID, THEM_ID):
            inside = token == YOU_ID
        elif token == PAD_ID:
            break
        else:
            mask[i] = inside
    return mask


# ---------------------------------------------------------------------------------------------
# Text interface


class NegotiationText:
    """Whole-utterance text for agents that speak strings (see ludus.games.dialogue for the rules on
    unknown words: they become the legal chat token `<unk>`)."""

    @staticmethod
    def encode_utterance(text: str) -> list[int]:
        return dialogue.encode_utterance(VOCAB, text)

    @staticmethod
    def decode(tokens: Sequence[int] | np.ndarray) -> str:
        return dialogue.decode(VOCAB, tokens)

    @staticmethod
    def play_text_turn(game: Negotiation, seat: int, text: str) -> list[int]:
        return dialogue.play_text_turn(game, seat, text)


# ---------------------------------------------------------------------------------------------
# Metrics and references


@dataclass(frozen=True)
class ReferenceScores:
    """Scores of reference splits averaged over contexts (every split assumed agreed)."""

    num_contexts: int
    random_split_joint: float
    """Joint score of a split drawn uniformly over all splits (each seat expects 5)."""
    best_joint: float
    """Joint score of the split maximising the sum (each item to whoever values it more)."""
    fair_maxmin: float
    """max over splits of min(score0, score1): the fairest split's lower score."""


_SPLIT_GRID = np.array(list(itertools.product(range(MAX_COUNT + 1), repeat=NUM_ITEM_TYPES)), dtype=np.int64)


def _split_table(contexts: Sequence[Context]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per context and candidate split (seat 0 takes grid row g): validity, score 0, score 1."""
    counts = np.array([c.counts for c in contexts], dtype=np.int64)                      # [N, 3]
    values = np.array([c.values for c in contexts], dtype=np.int64)                      # [N, 2, 3]
    valid = np.all(_SPLIT_GRID[None, :, :] <= counts[:, None, :], axis=2)                 # [N, G]
    score0 = np.einsum("gk,nk->ng", _SPLIT_GRID, values[:, 0])
    score1 = (counts * values[:, 1]).sum(axis=1)[:, None] - np.einsum("gk,nk->ng", _SPLIT_GRID, values[:, 1])
    return valid, score0, score1


def reference_scores(contexts: Sequence[Context]) -> ReferenceScores:
    """The §4 references of docs/reference.md over `contexts` (20k: 10.0, 15.1, 6.67)."""
    if not contexts:
        raise GameError("reference_scores needs at least one context")
    valid, score0, score1 = _split_table(contexts)
    joint = (score0 + score1).astype(np.float64)
    random_joint = np.where(valid, joint, 0.0).sum(axis=1) / valid.sum(axis=1)
    best = np.where(valid, joint, -np.inf).max(axis=1)
    fair = np.where(valid, np.minimum(score0, score1), -1).max(axis=1)
    return ReferenceScores(len(contexts), float(random_joint.mean()), float(best.mean()), float(fair.mean()))


def best_joint_score(context: Context) -> int:
    """The highest joint score any split of this context reaches."""
    return int(np.dot(context.counts, np.maximum(context.values[0], context.values[1])))


@dataclass(frozen=True)
class NegotiationSummary:
    """Aggregate measurements over negotiations (per seat where it matters)."""

    num_games: int
    agreement_rate: float
    mean_scores: tuple[float, float]
    """Mean final return of seat 0 and seat 1 (0 counted for no-deal games)."""
    mean_joint: float
    """Mean of score0 + score1."""
    mean_best_joint: float
    """Mean best possible joint score over the same contexts (the ceiling for mean_joint)."""
    parseable_rate: float
    """Fraction of utterances that parsed as a proposal or `deal`."""
    distinct_utterances: int
    """Number of different utterances said across the games (a language-collapse signal)."""
    mean_utterances: float


def summarize(records: Sequence[NegotiationRecord]) -> NegotiationSummary:
    if not records:
        raise GameError("summarize needs at least one finished negotiation")
    scores = np.array([r.scores for r in records], dtype=np.float64)
    total_utterances = sum(r.num_utterances for r in records)
    return NegotiationSummary(
        num_games=len(records),
        agreement_rate=float(np.mean([r.agreed for r in records])),
        mean_scores=(float(scores[:, 0].mean()), float(scores[:, 1].mean())),
        mean_joint=float(scores.sum(axis=1).mean()),
        mean_best_joint=float(np.mean([best_joint_score(r.context) for r in records])),
        parseable_rate=(sum(r.parseable_utterances for r in records) / total_utterances
                        if total_utterances else 0.0),
        distinct_utterances=len({u for r in records for u in r.utterances}),
        mean_utterances=total_utterances / len(records))


# ---------------------------------------------------------------------------------------------
# The entry point (games/registry.py BUILTIN_GAMES)


NEGOTIATION_ENTRY = GameEntry(
    "negotiation", Negotiation, None,
    "Deal-or-no-deal dialogue: split books, hats and balls by talking, one word per step",
    layout="observation: int64 token ids (the vocabulary below), length 9 + max_utterances * "
           "(max_utterance_tokens + 2) = 69 by default: 'book <count> v<value> hat <count> v<value> ball <count> "
           "v<value>' with the seat's own values, then the dialogue so far, each utterance opened by YOU: or "
           "THEM: and closed by <eou>, right-padded with <pad> (id 0).\n"
           "actions: the token id of the next word of the seat's utterance; special tokens are never legal.\n"
           "seat 0 speaks first; 'i want <n> book <n> hat <n> ball' proposes, 'deal' accepts the partner's "
           "standing offer.")
