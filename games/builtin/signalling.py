"""`signalling`: a cooperative sender/receiver game (Lewis 1969 signalling games), the smallest
dialogue game: a quick check that a learner can come to share a language at all.

Chance draws a target among `num_objects` objects. Seat 0 (the sender) sees it and says
1 to `message_length` words from `num_words` meaningless words, closed by `<eou>` (at the word
cap `<eou>` is the only legal token). Seat 1 (the receiver) sees only the message and picks an
object. Both get 1 when the pick is the target, else 0. A random receiver scores
1/num_objects; a learned code scores 1 as long as num_words ** message_length >= num_objects
(defaults: 4 ** 2 = 16 messages for 6 objects, counting the 1-word ones too).

Observations are int64 token ids, length 3 + message_length:
``SENDER obj<t> <message so far> <pad>...`` for the sender and
``RECEIVER ? <message so far> <pad>...`` for the receiver.
Not zero-sum (both seats get the same reward); each seat is its own team in `GameSpec`.
"""

from __future__ import annotations

import numpy as np

from ludus.games import dialogue
from ludus.games.core import GameError, GameSpec
from ludus.games.dialogue import EOU, PAD, Vocabulary
from ludus.games.registry import GameEntry

SENDER, RECEIVER, HIDDEN = "SENDER", "RECEIVER", "?"


def signalling_vocabulary(num_objects: int, num_words: int) -> Vocabulary:
    objects = tuple(f"obj{i}" for i in range(num_objects))
    return Vocabulary(
        words=(PAD, SENDER, RECEIVER, HIDDEN, *objects, EOU, *(f"w{i}" for i in range(num_words)),
               *(f"pick{i}" for i in range(num_objects))),
        special=frozenset({PAD, SENDER, RECEIVER, HIDDEN, *objects}))


class Signalling:
    """The signalling game; see the module docstring."""

    def __init__(self, num_objects: int = 6, num_words: int = 4, message_length: int = 2):
        if not 2 <= num_objects <= 64:
            raise GameError(f"num_objects must be 2..64, got {num_objects}")
        if not 1 <= num_words <= 64:
            raise GameError(f"num_words must be 1..64, got {num_words}")
        if not 1 <= message_length <= 16:
            raise GameError(f"message_length must be 1..16, got {message_length}")
        self.num_objects, self.num_words, self.message_length = num_objects, num_words, message_length
        self.max_utterance_tokens = message_length
        self.vocab = signalling_vocabulary(num_objects, num_words)
        params = [f"{k}={v}" for k, v, d in (("num_objects", num_objects, 6), ("num_words", num_words, 4),
                                             ("message_length", message_length, 2)) if v != d]
        self.spec = GameSpec(
            id=f"signalling({','.join(params)})" if params else "signalling",
            num_players=2, num_actions=len(self.vocab), observation_shape=(3 + message_length,),
            zero_sum=False, utility_sum=None, min_utility=0.0, max_utility=1.0,
            max_length=message_length + 2, has_chance=True, perfect_information=False,
            observation_dtype="int64", observation_low=0.0, observation_high=float(len(self.vocab) - 1))
        v = self.vocab
        self._object_ids = np.array(v.ids([f"obj{i}" for i in range(num_objects)]), dtype=np.int64)
        self._pick_ids = np.array(v.ids([f"pick{i}" for i in range(num_objects)]), dtype=np.int64)
        word_ids = v.ids([f"w{i}" for i in range(num_words)])
        self._eou = v.id(EOU)
        self._mask_first = np.zeros(len(v), dtype=bool)
        self._mask_first[word_ids] = True
        self._mask_middle = self._mask_first.copy()
        self._mask_middle[self._eou] = True
        self._mask_at_cap = np.zeros(len(v), dtype=bool)
        self._mask_at_cap[self._eou] = True
        self._mask_pick = np.zeros(len(v), dtype=bool)
        self._mask_pick[self._pick_ids] = True
        self.reset(0)

    def reset(self, seed: int) -> None:
        if int(seed) < 0:
            raise GameError(f"game seeds are non-negative integers, got {seed}")
        self._target = int(np.random.default_rng(int(seed)).integers(self.num_objects))
        self._message: list[int] = []
        self._message_done = False
        self._pick: int | None = None
        self._history: list[int] = []
        self._returns = np.zeros(2, dtype=np.float32)

    def target(self) -> int:
        return self._target

    def to_move(self) -> tuple[int, ...]:
        if self._pick is not None:
            return ()
        return (1,) if self._message_done else (0,)

    def observation(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        obs = np.full(self.spec.observation_shape, self.vocab.id(PAD), dtype=np.int64)
        if seat == 0:
            obs[0], obs[1] = self.vocab.id(SENDER), self._object_ids[self._target]
        else:
            obs[0], obs[1] = self.vocab.id(RECEIVER), self.vocab.id(HIDDEN)
        spoken = self._message + ([self._eou] if self._message_done else [])
        obs[2:2 + len(spoken)] = spoken
        return obs

    def legal_mask(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        if seat not in self.to_move():
            return np.zeros(len(self.vocab), dtype=bool)
        if seat == 1:
            return self._mask_pick.copy()
        if not self._message:
            return self._mask_first.copy()
        if len(self._message) >= self.message_length:
            return self._mask_at_cap.copy()
        return self._mask_middle.copy()

    def step(self, actions: dict[int, int]) -> np.ndarray:
        movers = self.to_move()
        if not movers:
            raise GameError("the signalling game is over: reset it before stepping")
        if set(actions) != set(movers):
            raise GameError(f"seat {movers[0]} is to move; got actions for seats {sorted(actions)}")
        seat = movers[0]
        token = int(actions[seat])
        if not (0 <= token < len(self.vocab) and self.legal_mask(seat)[token]):
            raise GameError(f"token {token} is not legal for seat {seat} now: read legal_mask()")
        self._history.append(token)
        rewards = np.zeros(2, dtype=np.float32)
        if seat == 0:
            if token == self._eou:
                self._message_done = True
            else:
                self._message.append(token)
            return rewards
        self._pick = int(np.flatnonzero(self._pick_ids == token)[0])
        if self._pick == self._target:
            rewards[:] = 1.0
            self._returns += rewards
        return rewards

    def is_terminal(self) -> bool:
        return self._pick is not None

    def is_truncated(self) -> bool:
        return False

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def utterance_length(self) -> int:
        """Words the sender has said (the text interface plays the sender's turn)."""
        return 0 if self._message_done else len(self._message)

    def render(self) -> str:
        lines = [f"target: obj{self._target}",
                 f"message: {dialogue.decode(self.vocab, self._message)}"
                 + (" <eou>" if self._message_done else " ...")]
        if self._pick is not None:
            lines.append(f"receiver picks obj{self._pick}: {'right' if self._pick == self._target else 'wrong'}")
        return "\n".join(lines)

    def _check_seat(self, seat: int) -> None:
        if seat not in (0, 1):
            raise GameError(f"signalling has seats 0 (sender) and 1 (receiver), got {seat}")


SIGNALLING_ENTRY = GameEntry(
    "signalling", Signalling, None,
    "Cooperative sender/receiver: name the target in up to 2 words, the receiver picks it",
    layout="observation: int64 token ids (the vocabulary below), length 3 + message_length: "
           "'SENDER obj<target> <message so far>' for seat 0, 'RECEIVER ? <message so far>' for seat 1, "
           "right-padded with <pad> (id 0).\n"
           "actions: the token id of a word: seat 0 says w<i> words closed by <eou>, then seat 1 says "
           "pick<i>; both get 1 if i is the target, else 0.")
