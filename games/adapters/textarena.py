"""TextArena games as Ludus `Game`s (id ``ta:<env id>``, e.g. ``ta:TicTacToe-v0``).

TextArena (Guertler et al. 2025) tells its games in text: a seat reads a stream of messages and
answers with free text that the game parses, as SPIRAL (Liu et al. 2025, arXiv 2506.24119) trains
on. Ludus's protocol has discrete actions with legal masks, which every agent kind (nets, MCTS,
scripted bots, LMs) and every record (ledger histories, replays) rely on, so the adapter meets it
in the middle:

* **Observation**: the seat's TextArena observation (the text its observation wrapper builds, e.g.
  the whole message history for ``-v0`` ids, prompt plus current board for ``-train`` ids) as
  UTF-8 bytes, zero-padded to ``max_bytes`` (an id parameter, default 8192). A longer text keeps
  its head (the rules and the seat's private facts) and its tail (the latest messages) around a
  marker. The text view (games/text.py) decodes it back, so a language model reads exactly what
  TextArena would have shown it.
* **Actions**: numbers of the game's move list, a fact of each supported TextArena game (its
  bracketed moves: ``[4]``, ``[bet]``, ...). The move list is the one thing TextArena does not
  state, so only the games in `_FAMILIES` are adapted; others fail with a one-line error. The
  legal mask is TextArena's own rule: each move is tried on a copy of the game, and the moves it
  would reject as invalid are masked.
* **Randomness**: TextArena draws from Python's global `random`, seeded in ``reset``. Each game
  here keeps its own generator state and swaps it in around every call, so games stepped side by
  side (a vector of games, two matches in a runner) do not draw from each other's stream and a
  seed replays the same game.

Free-text games whose moves cannot be listed (SimpleNegotiation's offers, chat games) are not
adapted: their turn is not one of finitely many answers.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
from typing import Any, Callable, Iterator

import numpy as np

from ludus.games.core import GameError, GameSpec
from ludus.games.text import normal_answer

DEFAULT_MAX_BYTES = 8192
_CUT = "\n[...]\n"


@dataclasses.dataclass(frozen=True)
class TextArenaFacts:
    """What Ludus needs to know about a TextArena game that TextArena does not state."""

    moves: tuple[str, ...]
    """Every move the game accepts, as the text between the brackets; action i is ``[moves[i]]``."""
    max_length: int
    """Most moves a game takes (its rules bound it; invalid moves never reach it here)."""
    has_chance: bool
    """The game deals cards or rolls dice."""
    perfect_information: bool
    """Both seats see the whole state."""


def _board(cells: int) -> TextArenaFacts:
    return TextArenaFacts(tuple(str(i) for i in range(cells)), cells, False, True)


_FAMILIES: dict[str, Callable[[dict[str, Any]], TextArenaFacts]] = {
    # keyed by the package folder of the env's entry point; given the registered kwargs
    "TicTacToe": lambda kw: _board(9),
    "ReverseTicTacToe": lambda kw: _board(9),
    "ConnectFour": lambda kw: TextArenaFacts(tuple(str(c) for c in range(kw["num_cols"])),
                                             kw["num_rows"] * kw["num_cols"], False, bool(kw["is_open"])),
    # per round: check/bet, then bet/call/fold, then call/fold at most
    "KuhnPoker": lambda kw: TextArenaFacts(("check", "bet", "call", "fold"), 3 * kw["max_rounds"], True, False),
}


def _textarena():
    try:
        import textarena
    except ImportError:
        raise GameError("ta: games need TextArena: pip install textarena==0.7.4 "
                        "(or bash scripts/setup.sh)") from None
    return textarena


def _parse(text: str) -> tuple[str, int]:
    """``TicTacToe-v0(max_bytes=4096)`` -> (env id, max_bytes)."""
    from ludus.games.registry import parse_params

    env_id, params = text.strip(), {}
    if env_id.endswith(")") and "(" in env_id:
        env_id, _, inside = env_id[:-1].partition("(")
        params = parse_params(inside, f"ta:{text}")
    max_bytes = params.pop("max_bytes", DEFAULT_MAX_BYTES)
    if params:
        raise GameError(f"ta:{text}: unknown parameter(s) {sorted(params)}; ta: ids take only max_bytes")
    if not isinstance(max_bytes, int) or max_bytes < 256:
        raise GameError(f"ta:{text}: max_bytes must be an integer >= 256, got {max_bytes!r}")
    return env_id.strip(), max_bytes


def textarena_facts(env_id: str) -> TextArenaFacts:
    """The facts of a registered TextArena env id; GameError for unknown or unadapted ones."""
    ta = _textarena()
    registry = ta.envs.registration.ENV_REGISTRY
    if env_id not in registry:
        import difflib

        close = difflib.get_close_matches(env_id, list(registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join('ta:' + c for c in close)}?" if close else ""
        raise GameError(f"unknown TextArena env {env_id!r}{hint}")
    entry = registry[env_id]
    point = entry.entry_point if isinstance(entry.entry_point, str) else \
        f"{entry.entry_point.__module__}:{entry.entry_point.__name__}"
    family = point.split(":")[0].split(".")[-2]
    if family not in _FAMILIES:
        raise GameError(f"TextArena env {env_id!r} has no move list in Ludus (games/adapters/textarena.py adapts "
                        f"{', '.join(sorted(_FAMILIES))}); a free-text game cannot be a finite action space")
    return _FAMILIES[family](dict(entry.kwargs))


def decode_text(obs: np.ndarray) -> str:
    """The text of a ``ta:`` observation (its bytes up to the padding)."""
    data = np.asarray(obs, dtype=np.uint8).reshape(-1).tobytes()
    return data.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def encode_text(text: str, max_bytes: int) -> np.ndarray:
    """`text` as UTF-8 bytes zero-padded to `max_bytes`; a longer text keeps its first and last
    parts around a marker (rules and private facts come first, the latest messages last)."""
    data = text.replace("\0", "").encode("utf-8")
    if len(data) > max_bytes:
        cut = _CUT.encode()
        head = (max_bytes - len(cut)) // 4
        tail = max_bytes - len(cut) - head
        # errors="ignore" drops a character split at either edge
        data = (data[:head].decode("utf-8", "ignore").encode() + cut
                + data[len(data) - tail:].decode("utf-8", "ignore").encode())
    out = np.zeros(max_bytes, dtype=np.uint8)
    out[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    return out


class TextArenaGame:
    """One two-player TextArena game (see the module docstring for the mapping)."""

    def __init__(self, text: str):
        self._ta = _textarena()
        self.env_id, self.max_bytes = _parse(text)
        self.facts = textarena_facts(self.env_id)
        suffix = "" if self.max_bytes == DEFAULT_MAX_BYTES else f"(max_bytes={self.max_bytes})"
        self.spec = GameSpec(
            id=f"ta:{self.env_id}{suffix}", num_players=2, num_actions=len(self.facts.moves),
            observation_shape=(self.max_bytes,), zero_sum=True, utility_sum=0.0,
            min_utility=-1.0, max_utility=1.0, max_length=self.facts.max_length,
            has_chance=self.facts.has_chance, perfect_information=self.facts.perfect_information,
            observation_dtype="uint8", observation_low=0.0, observation_high=255.0)
        self._env = None

    # -- TextArena's global random, kept per game

    @contextlib.contextmanager
    def _own_random(self, keep: bool = True) -> Iterator[None]:
        outside = random.getstate()
        random.setstate(self._random)
        try:
            yield
        finally:
            if keep:
                self._random = random.getstate()
            random.setstate(outside)

    # -- the protocol

    def reset(self, seed: int) -> None:
        self._random = random.Random(int(seed)).getstate()
        with self._own_random():
            self._env = self._ta.make(self.env_id)
            self._env.reset(num_players=2, seed=int(seed))
        self._history: list[int] = []
        self._returns = np.zeros(2, dtype=np.float32)
        self._texts = {0: "", 1: ""}
        self._done = False
        self._truncated = False
        self._read()

    def _read(self) -> None:
        """Take the mover's observation from TextArena (which hands each message out once)."""
        self._mask = None
        if self._done:
            self._current = None
            return
        with self._own_random():
            player, text = self._env.get_observation()
        self._current = int(player)
        self._texts[self._current] = text if isinstance(text, str) else str(text)

    def _need_env(self) -> None:
        if self._env is None:
            raise GameError(f"{self.spec.id}: call reset(seed) before playing")

    def to_move(self) -> tuple[int, ...]:
        self._need_env()
        return () if self._done else (self._current,)

    def observation(self, seat: int) -> np.ndarray:
        self._need_env()
        return encode_text(self._texts[seat], self.max_bytes)

    def _rejects(self, move: str) -> bool:
        """Whether TextArena would reject `move` now (tried on a copy; our generator is not advanced)."""
        trial = copy.deepcopy(self._env)
        with self._own_random(keep=False):
            trial.step(f"[{move}]")
        state = trial.state
        info = state.game_info.get(self._current, {}) if isinstance(getattr(state, "game_info", None), dict) else {}
        return getattr(state, "error_count", 0) > 0 or bool(info.get("invalid_move", False))

    def legal_mask(self, seat: int) -> np.ndarray:
        self._need_env()
        if self._done or seat != self._current:
            return np.zeros(self.spec.num_actions, dtype=bool)
        if self._mask is None:
            self._mask = np.array([not self._rejects(m) for m in self.facts.moves], dtype=bool)
            if not self._mask.any():
                raise GameError(f"{self.spec.id}: TextArena rejects every move of "
                                f"{list(self.facts.moves)}; games/adapters/textarena.py's move list is wrong")
        return self._mask.copy()

    def step(self, actions: dict[int, int]) -> np.ndarray:
        self._need_env()
        if self._done:
            raise GameError(f"{self.spec.id}: step after the game is over")
        if set(actions) != {self._current}:
            raise GameError(f"{self.spec.id}: seat {self._current} is to move, got actions for {sorted(actions)}")
        action = int(actions[self._current])
        if not (0 <= action < self.spec.num_actions and self.legal_mask(self._current)[action]):
            raise GameError(f"{self.spec.id}: action {action} is not legal for seat {self._current}")
        with self._own_random():
            done, _ = self._env.step(f"[{self.facts.moves[action]}]")
        self._history.append(action)
        rewards = np.zeros(2, dtype=np.float32)
        if done:
            final, _ = self._env.close()
            rewards = np.array([float(final[0]), float(final[1])], dtype=np.float32)
            self._returns += rewards
            self._done = True
        elif len(self._history) >= self.spec.max_length:
            self._done = self._truncated = True
        self._read()
        return rewards

    def is_terminal(self) -> bool:
        return self._done and not self._truncated

    def is_truncated(self) -> bool:
        return self._truncated

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        if self._env is None:
            return f"{self.spec.id} (not started)"
        if hasattr(self._env, "get_board_str"):
            return str(self._env.get_board_str())
        seat = self._current if self._current is not None else 0
        return self._texts[seat][-2000:]  # not every TextArena env draws its board


def make_textarena_game(text: str) -> TextArenaGame:
    return TextArenaGame(text)


def describe_layout(game: TextArenaGame) -> list[str]:
    """`ludus games --describe` lines of a ``ta:`` game (the adapter record's `layout` hook)."""
    return [f"observation: the seat's TextArena observation text as UTF-8 bytes, zero-padded to "
            f"{game.max_bytes} (a longer text keeps its head and tail around '[...]')",
            "actions: the answers " + ", ".join(f"{i} [{m}]" for i, m in enumerate(game.facts.moves))
            + "; those TextArena would reject now are masked"]


@dataclasses.dataclass(frozen=True)
class TextArenaView:
    """A ``ta:`` game told as TextArena tells it: the observation is TextArena's own text, so the
    view only adds the legal moves and maps answers to actions (a `ludus.games.text.TextView`)."""

    game_id: str
    title: str
    moves: tuple[str, ...]
    """The game's move list: action i is the answer ``[moves[i]]``."""

    def rules(self) -> str:
        return (f"You are playing {self.title} from TextArena. The game's messages follow. Answer with "
                f"exactly one move in square brackets, chosen from your legal moves.")

    def role(self, seat: int) -> str:
        return f"You are Player {seat}."

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        legal = " ".join(f"[{self.moves[a]}]" for a in np.flatnonzero(mask))
        return f"{decode_text(obs).strip()}\nYour legal moves: {legal}"

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        return {normal_answer(self.moves[a]): int(a) for a in np.flatnonzero(mask)}

    def normal_form(self, answer: str) -> str:
        return answer


def textarena_view(text: str) -> TextArenaView:
    """The text view of the ``ta:`` id ``ta:<text>`` (the adapter record's `text_view` hook)."""
    game = make_textarena_game(text)  # the id's facts (and a one-line error for an unadapted env)
    return TextArenaView(game.spec.id, game.env_id, game.facts.moves)
