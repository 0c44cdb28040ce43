"""Shared pieces of the dialogue games: vocabularies, the text <-> token mapping, outcomes.

In a dialogue game one action is one word token. A seat keeps acting (stays in `to_move()`)
until it emits the end-of-utterance token `<eou>`; then the turn passes. Observations are
token ids (`observation_dtype` "int64"), so a language-model policy can embed them directly.

Agents that speak whole strings (scripted text bots, LMs, people at `ludus play`) go through
`encode_utterance` / `play_text_turn`. Unknown words are not an error: they map to the legal
chat token `<unk>`, so a free-text agent can always take its turn and simply says nothing the
parser understands (it is "chat"). Special tokens (padding, speaker markers, context tokens)
are not speakable and map to `<unk>` too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ludus.games.core import Game, GameError

PAD = "<pad>"
EOU = "<eou>"
UNK = "<unk>"


@dataclass(frozen=True)
class Vocabulary:
    """The token set of a dialogue game; token id = position in `words`.

    `special` words (padding, speaker markers, context-only tokens) can appear in observations
    but are never legal actions; every other word is speakable.
    """

    words: tuple[str, ...]
    """All tokens, id order; words[0] must be `<pad>`."""
    special: frozenset[str]
    """Tokens that only the game writes (never legal actions)."""

    def __post_init__(self) -> None:
        if not self.words or self.words[0] != PAD:
            raise ValueError("a vocabulary starts with <pad> (id 0, the observation padding)")
        if len(set(self.words)) != len(self.words):
            raise ValueError("vocabulary words must be distinct")
        if not self.special <= set(self.words):
            raise ValueError(f"special tokens {sorted(self.special - set(self.words))} are not in the vocabulary")

    def __len__(self) -> int:
        return len(self.words)

    @functools.cached_property
    def index(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.words)}

    def id(self, word: str) -> int:
        """Token id of `word`; KeyError if absent (game code only; text goes through encode_utterance)."""
        return self.index[word]

    def ids(self, words: Sequence[str]) -> list[int]:
        return [self.index[w] for w in words]

    @functools.cached_property
    def speakable_mask(self) -> np.ndarray:
        """[V] bool: tokens a seat may emit (everything but special tokens)."""
        mask = np.array([w not in self.special for w in self.words], dtype=bool)
        mask.setflags(write=False)
        return mask


def encode_utterance(vocab: Vocabulary, text: str) -> list[int]:
    """Word token ids of one utterance, without `<eou>`.

    Words are split on whitespace and lowercased except for tokens spelled in the vocabulary with
    capitals. A trailing `<eou>` is dropped; unknown or special words become `<unk>` (legal chat)
    when the vocabulary has it, otherwise they raise GameError.
    """
    words = text.split()
    if words and words[-1] == EOU:
        words = words[:-1]
    ids: list[int] = []
    for word in words:
        key = word if word in vocab.index else word.lower()
        token = vocab.index.get(key)
        if token is None or key in vocab.special or key == EOU:
            if UNK not in vocab.index:
                raise GameError(f"word {word!r} is not speakable in this game: use words from "
                                f"{' '.join(w for w in vocab.words if w not in vocab.special)}")
            token = vocab.index[UNK]
        ids.append(token)
    return ids


def decode(vocab: Vocabulary, tokens: Sequence[int] | np.ndarray, skip_padding: bool = True) -> str:
    """Tokens as space-separated words (padding dropped unless asked for)."""
    pad = vocab.index[PAD]
    words = []
    for token in np.asarray(tokens, dtype=np.int64).tolist():
        if not 0 <= token < len(vocab):
            raise GameError(f"token id {token} is outside the vocabulary of {len(vocab)} words")
        if skip_padding and token == pad:
            continue
        words.append(vocab.words[token])
    return " ".join(words)


class TextDialogueGame(Game, Protocol):
    """A dialogue game that whole-utterance text agents can play."""

    vocab: Vocabulary
    max_utterance_tokens: int

    def utterance_length(self) -> int:
        """Word tokens the seat to move has emitted so far in its current utterance."""
        ...


def play_text_turn(game: TextDialogueGame, seat: int, text: str) -> list[int]:
    """Feed a whole utterance (words, then `<eou>`) for `seat`; returns the token ids applied.

    The utterance must start a turn (no partial utterance pending), have at least one word and
    at most `game.max_utterance_tokens` words; every token must be legal where it is applied.
    """
    if game.to_move() != (seat,):
        raise GameError(f"it is not seat {seat}'s turn to speak (to move: {game.to_move()})")
    if game.utterance_length() != 0:
        raise GameError(f"seat {seat} is in the middle of an utterance: finish it token by token")
    tokens = encode_utterance(game.vocab, text)
    if not tokens:
        raise GameError("empty utterance: say at least one word")
    if len(tokens) > game.max_utterance_tokens:
        raise GameError(f"utterance has {len(tokens)} words, the game allows at most "
                        f"{game.max_utterance_tokens}: say it shorter")
    tokens.append(game.vocab.id(EOU))
    for token in tokens:
        if not game.legal_mask(seat)[token]:
            raise GameError(f"word {game.vocab.words[token]!r} is not legal here")
        game.step({seat: token})
    return tokens


def dialogue_outcome(returns: Sequence[float] | np.ndarray) -> tuple[int, ...]:
    """Ranks for TrueSkill (0 = best, ties share a rank): the higher own score wins, equal draws.

    The dialogue games are not zero-sum, so the match result for rating purposes is read off
    the scores: e.g. returns (7, 3) -> (0, 1); (0, 0) (no agreement) -> (0, 0), a draw.
    """
    scores = np.asarray(returns, dtype=np.float64)
    distinct = sorted(set(scores.tolist()), reverse=True)
    return tuple(distinct.index(s) for s in scores.tolist())
