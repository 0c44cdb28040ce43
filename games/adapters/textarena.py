"""TextArena games as Ludus `Game`s (id ``ta:<env id>``, e.g. ``ta:SimpleNegotiation-v0``).

TextArena (Guertler et al. 2025) tells its games in text: a seat reads a stream of messages and
answers with free text that the game parses and judges, as SPIRAL (Liu et al. 2025, arXiv
2506.24119) trains on. Every TextArena game that two players can play is adapted, as a
text-move game (`ludus.games.core.TextMoveGame`):

* **Observation**: the seat's TextArena observation (the text its observation wrapper builds, e.g.
  the whole message history for ``-v0`` ids, prompt plus current board for ``-train`` ids) as
  UTF-8 bytes, zero-padded to ``max_bytes`` (an id parameter, default 8192). A longer text keeps
  its head (the rules and the seat's private facts) and its tail (the latest messages) around a
  marker. The text view decodes it back, so a language model reads what TextArena would have
  shown it (with its speaker tags written as names, `speakers_as_names`).
* **Moves**: text, judged by TextArena itself with its own invalid-move rule: its error allowance
  (one by default) lets a seat that made an invalid move try again, told why in its next
  observation; past it, the seat loses. Every move's text and every invalid move is recorded
  (`record`). A game that raises ends with an 'error' record instead of crashing the runner.
* **Listed answers**: where Ludus knows a family's moves (`_FAMILIES`: tic-tac-toe, Connect Four,
  Kuhn poker), action i is the answer ``[moves[i]]`` and the legal mask is TextArena's own rule
  (each move is tried on a copy of the game), so nets, bots and the random mover play it too.
  Every other game has one action, the empty move (which TextArena judges invalid): only a
  text agent plays such a game.
* **Returns**: who won, +1 and -1, or 0 each for a draw (TextArena's rewards, read by their order:
  a few games reward scores, e.g. Poker's chip counts).
* **Randomness**: TextArena draws from Python's global `random`, seeded in ``reset``. Each game
  here keeps its own generator state and swaps it in around every call, so games stepped side by
  side do not draw from each other's stream and a seed and the move texts replay the same game.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import random
import re
import signal
import threading
from typing import Any, Callable, Iterator

import numpy as np

from ludus.games.core import GameError, GameSpec, TextGameRecord
from ludus.games.text import normal_answer

STEP_SECONDS = 10.0
"""Longest a TextArena call may take before the game ends with an error: a game that loops
forever (MarketEntryGame's turn rotation once every seat is eliminated) would hang its runner."""
DEFAULT_MAX_BYTES = 8192
DEFAULT_MAX_STEPS = 400
"""Most moves (invalid ones included) a ``ta:`` game may take before it is truncated, where the
id names no ``max_steps``: TextArena bounds most games by turns, a few (board games) only by rules."""
_CUT = "\n[...]\n"
_SPEAKER = re.compile(r"(?m)^\[([A-Za-z][A-Za-z0-9 ]{0,39})\](?=[ \t])")
"""A speaker tag at the start of a message line, as TextArena's observation wrapper writes it:
``[GAME]``, ``[Player 1]``, or a role (``[Commander Alpha]``)."""


@dataclasses.dataclass(frozen=True)
class TextArenaFacts:
    """What Ludus knows about a TextArena game that TextArena does not state."""

    moves: tuple[str, ...]
    """Every move the game accepts, as the text between the brackets; action i is ``[moves[i]]``.
    Empty for games whose moves cannot be listed (free text)."""
    max_length: int
    """Most moves a game takes (its rules bound it; invalid moves never reach it through actions)."""
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


def _free_text(max_steps: int) -> TextArenaFacts:
    # Unknown games may deal, hide information and run long: the conservative facts.
    return TextArenaFacts((), max_steps, True, False)


def _textarena():
    try:
        import textarena
    except ImportError:
        raise GameError("ta: games need TextArena: pip install textarena==0.7.4 "
                        "(or bash scripts/setup.sh)") from None
    return textarena


@dataclasses.dataclass(frozen=True)
class TextArenaId:
    """A ``ta:`` id's parts: ``SimpleNegotiation-v0(max_bytes=4096, max_steps=100)``."""

    env_id: str
    max_bytes: int = DEFAULT_MAX_BYTES
    """Longest observation text kept, in UTF-8 bytes."""
    max_steps: int = DEFAULT_MAX_STEPS
    """Most moves before the game is truncated (free-text games; listed games end by their rules)."""

    @property
    def suffix(self) -> str:
        params = [f"{k}={v}" for k, v, default in (("max_bytes", self.max_bytes, DEFAULT_MAX_BYTES),
                                                     ("max_steps", self.max_steps, DEFAULT_MAX_STEPS)) if v != default]
        return f"({', '.join(params)})" if params else ""


def _parse(text: str) -> TextArenaId:
    from ludus.games.registry import parse_params

    env_id, params = text.strip(), {}
    if env_id.endswith(")") and "(" in env_id:
        env_id, _, inside = env_id[:-1].partition("(")
        params = parse_params(inside, f"ta:{text}")
    max_bytes = params.pop("max_bytes", DEFAULT_MAX_BYTES)
    max_steps = params.pop("max_steps", DEFAULT_MAX_STEPS)
    if params:
        raise GameError(f"ta:{text}: unknown parameter(s) {sorted(params)}; ta: ids take max_bytes and max_steps")
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 256 <= max_bytes <= 1 << 20:
        raise GameError(f"ta:{text}: max_bytes must be an integer in [256, 1048576], got {max_bytes!r}")
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or not 1 <= max_steps <= 10_000:
        raise GameError(f"ta:{text}: max_steps must be an integer in [1, 10000], got {max_steps!r}")
    return TextArenaId(env_id.strip(), max_bytes, max_steps)


def _family(env_id: str) -> str:
    """The package folder of a registered env's entry point ("SimpleNegotiation"); GameError for an
    unknown id."""
    registry = _textarena().envs.registration.ENV_REGISTRY
    if env_id not in registry:
        import difflib

        close = difflib.get_close_matches(env_id, list(registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join('ta:' + c for c in close)}?" if close else ""
        raise GameError(f"unknown TextArena env {env_id!r}{hint}")
    entry = registry[env_id]
    point = entry.entry_point if isinstance(entry.entry_point, str) else \
        f"{entry.entry_point.__module__}:{entry.entry_point.__name__}"
    return point.split(":")[0].split(".")[-2]


def textarena_facts(env_id: str, max_steps: int = DEFAULT_MAX_STEPS) -> TextArenaFacts:
    """The facts of a registered TextArena env id (a listed family's, else free text's)."""
    family = _family(env_id)
    if family in _FAMILIES:
        return _FAMILIES[family](dict(_textarena().envs.registration.ENV_REGISTRY[env_id].kwargs))
    return _free_text(max_steps)


WORD_LIST = "/usr/share/dict/american-english"
"""Debian's English word list (package wamerican; scripts/setup.sh installs it)."""


@functools.lru_cache(maxsize=1)
def _words_corpus() -> str | None:
    """(Once per process.) A directory holding NLTK's "words" corpus built from `WORD_LIST` (one word per line,
    ASCII as NLTK reads it), in Ludus's cache: what TextArena's word games (WordChains,
    LetterAuction) read, without the download they would attempt. None without the word list."""
    import os

    from ludus.files import atomic_write_bytes, cache_root

    root = cache_root() / "nltk_data"
    target = root / "corpora" / "words" / "en"
    if not target.exists():
        if not os.path.exists(WORD_LIST):
            return None
        with open(WORD_LIST, encoding="utf-8", errors="ignore") as source:
            words = sorted({w.strip() for w in source if w.strip().isascii() and "'" not in w and w.strip()})
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, ("\n".join(words) + "\n").encode("ascii"))  # concurrent runners: all or none
        except OSError:  # a read-only cache (a sandbox): the word games are then refused, nothing else changes
            return None
    return str(root)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No downloads and no chatter while TextArena builds a game: some envs fetch NLTK corpora
    at import (Ludus never sends traffic off the machine; a missing corpus then fails as a
    LookupError that `_refusal` names) and print progress to stdout."""
    try:
        import nltk
    except ImportError:
        nltk = None
    saved = nltk.download if nltk is not None else None
    if nltk is not None:
        nltk.download = lambda *args, **kwargs: False
        corpus = _words_corpus()
        if corpus is not None and corpus not in nltk.data.path:
            nltk.data.path.insert(0, corpus)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if nltk is not None:
            nltk.download = saved


class StepTimeout(Exception):
    """A TextArena call ran past `STEP_SECONDS`."""


@contextlib.contextmanager
def _deadline(seconds: float = STEP_SECONDS) -> Iterator[None]:
    """Raise `StepTimeout` inside the block after `seconds` (a SIGALRM timer). Only the main
    thread receives signals and only one timer exists per process: elsewhere, or with a timer
    already set by someone else, the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def expire(signum, frame):
        raise StepTimeout(f"the game did not answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _refusal(env_id: str, exc: BaseException) -> GameError:
    """One line naming what a TextArena env lacks to be played here by two seats."""
    text = " ".join(str(exc).split())
    if isinstance(exc, SyntaxError):
        return GameError(f"ta:{env_id}: TextArena's source of this game does not parse on this Python "
                         f"({exc.msg}; it needs Python 3.12's f-strings)")
    if isinstance(exc, OSError) and "nltk_data" in text:  # a file of a corpus we built only in part
        resource = text.rsplit("nltk_data/", 1)[-1].strip("'\" ")
        return GameError(f"ta:{env_id}: needs the NLTK data {resource}, which is not on this machine "
                         f"(Ludus builds words/en from Debian's word list and downloads nothing)")
    if isinstance(exc, LookupError) and "nltk" in text.lower():
        resource = next((w.strip("'\"") for w in text.split() if w.startswith(("'", '"'))), "a corpus")
        return GameError(f"ta:{env_id}: needs the NLTK data {resource}, which is not installed "
                         f"(python3 -m nltk.downloader; Ludus downloads nothing)")
    if "OPENROUTER" in text.upper():
        return GameError(f"ta:{env_id}: its judge is a remote LLM (OpenRouter); Ludus sends no traffic off "
                         f"the machine")
    if isinstance(exc, AssertionError) and "player" in text.lower():
        return GameError(f"ta:{env_id}: not a two-player game ({text[:120]})")
    if isinstance(exc, (ImportError, FileNotFoundError)):
        return GameError(f"ta:{env_id}: TextArena's game is missing a piece here ({type(exc).__name__}: {text[:120]})")
    return GameError(f"ta:{env_id}: TextArena fails to start it for two players ({type(exc).__name__}: {text[:120]})")


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
        self.id = _parse(text)
        self.env_id, self.max_bytes = self.id.env_id, self.id.max_bytes
        self.facts = textarena_facts(self.env_id, self.id.max_steps)
        listed = bool(self.facts.moves)
        self.spec = GameSpec(
            id=f"ta:{self.env_id}{self.id.suffix}", num_players=2, num_actions=max(len(self.facts.moves), 1),
            observation_shape=(self.max_bytes,), zero_sum=True, utility_sum=0.0,
            min_utility=-1.0, max_utility=1.0,
            max_length=self.facts.max_length if listed else self.id.max_steps,
            has_chance=self.facts.has_chance, perfect_information=self.facts.perfect_information,
            observation_dtype="uint8", observation_low=0.0, observation_high=255.0, text_moves=True)
        self._env = None
        self._start(0)  # a game two seats cannot start is refused here, in one line

    # -- TextArena's global random, kept per game

    @contextlib.contextmanager
    def _own_random(self, keep: bool = True) -> Iterator[None]:
        outside = random.getstate()
        random.setstate(self._random)
        try:
            with _offline():
                yield
        finally:
            if keep:
                self._random = random.getstate()
            random.setstate(outside)

    # -- the protocol

    def _start(self, seed: int) -> None:
        self._random = random.Random(int(seed)).getstate()
        try:
            with self._own_random():
                self._env = self._ta.make(self.env_id)
                self._env.reset(num_players=2, seed=int(seed))
        except GameError:
            raise
        except Exception as exc:  # a third-party game that cannot start: one line naming why
            raise _refusal(self.env_id, exc) from None

    def reset(self, seed: int) -> None:
        self._start(seed)
        self._history: list[int] = []
        self._texts: list[str] = []
        self._invalid = [0, 0]
        self._error = ""
        self._returns = np.zeros(2, dtype=np.float32)
        self._seen = {0: "", 1: ""}
        self._done = False
        self._truncated = False
        self._read()

    def _read(self) -> None:
        """Take the mover's observation from TextArena (which hands each message out once)."""
        self._mask = None
        if self._done:
            self._current = None
            return
        try:
            with self._own_random(), _deadline():
                player, text = self._env.get_observation()
        except Exception as exc:
            self._fail(exc)
            return
        self._current = int(player)
        self._seen[self._current] = text if isinstance(text, str) else str(text)

    def _fail(self, exc: BaseException) -> None:
        """The game itself raised: it ends here with an error record and no result."""
        self._error = f"TextArena raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        self._done, self._current, self._mask = True, None, None

    def _need_env(self) -> None:
        if self._env is None or not hasattr(self, "_history"):
            raise GameError(f"{self.spec.id}: call reset(seed) before playing")

    def to_move(self) -> tuple[int, ...]:
        self._need_env()
        return () if self._done else (self._current,)

    def observation(self, seat: int) -> np.ndarray:
        self._need_env()
        return encode_text(self._seen[seat], self.max_bytes)

    def text(self, seat: int) -> str:
        """What `seat` has been told, as TextArena tells it (not cut to `max_bytes`)."""
        self._need_env()
        return self._seen[seat]

    def lists_moves(self) -> bool:
        return bool(self.facts.moves)

    def _state_errors(self, env: Any = None) -> tuple[int, bool]:
        """(the mover's invalid moves this turn, whether it lost by one) in `env` (ours by default)."""
        state = (env if env is not None else self._env).state
        info = state.game_info.get(self._current, {}) if isinstance(getattr(state, "game_info", None), dict) else {}
        return int(getattr(state, "error_count", 0) or 0), bool(info.get("invalid_move", False))

    def _rejects(self, move: str) -> bool:
        """Whether TextArena would reject `move` now (tried on a copy; our generator is not advanced)."""
        trial = copy.deepcopy(self._env)
        with self._own_random(keep=False):
            trial.step(f"[{move}]")
        errors, lost = self._state_errors(trial)
        return errors > 0 or lost

    def legal_mask(self, seat: int) -> np.ndarray:
        self._need_env()
        if self._done or seat != self._current:
            return np.zeros(self.spec.num_actions, dtype=bool)
        if not self.facts.moves:
            return np.ones(1, dtype=bool)  # the one action: a text agent's move (or the empty move)
        if self._mask is None:
            self._mask = np.array([not self._rejects(m) for m in self.facts.moves], dtype=bool)
            if not self._mask.any():
                raise GameError(f"{self.spec.id}: TextArena rejects every move of "
                                f"{list(self.facts.moves)}; games/adapters/textarena.py's move list is wrong")
        return self._mask.copy()

    def move_text(self, seat: int, action: int) -> str:
        self._need_env()
        if not self.facts.moves:
            if action != 0:
                raise GameError(f"{self.spec.id}: a free-text game has one action (0), got {action}")
            return ""
        if not (0 <= action < self.spec.num_actions and self.legal_mask(seat)[action]):
            raise GameError(f"{self.spec.id}: action {action} is not legal for seat {seat}")
        return f"[{self.facts.moves[action]}]"

    def step(self, actions: dict[int, int]) -> np.ndarray:
        self._need_env()
        self._check_movers(actions)
        action = int(actions[self._current])
        return self._play(self.move_text(self._current, action), action)

    def step_text(self, moves: dict[int, str]) -> np.ndarray:
        self._need_env()
        self._check_movers(moves)
        text = moves[self._current]
        if not isinstance(text, str):
            raise GameError(f"{self.spec.id}: a text move must be a str, got {type(text).__name__}")
        return self._play(text, -1)

    def _check_movers(self, moves: dict) -> None:
        if self._done:
            raise GameError(f"{self.spec.id}: step after the game is over")
        if set(moves) != {self._current}:
            raise GameError(f"{self.spec.id}: seat {self._current} is to move, got moves for {sorted(moves)}")

    def _play(self, text: str, action: int) -> np.ndarray:
        seat = self._current
        rewards = np.zeros(2, dtype=np.float32)
        try:
            with self._own_random(), _deadline():
                errors_before, _ = self._state_errors()
                done, _ = self._env.step(text)
                errors_after, lost_by_invalid = self._state_errors()
                if done:
                    final, _ = self._env.close()
        except Exception as exc:
            self._history.append(action)
            self._texts.append(text)
            self._fail(exc)
            return rewards
        self._history.append(action)
        self._texts.append(text)
        if errors_after > errors_before or lost_by_invalid:
            self._invalid[seat] += 1
        if done:
            # Who won, as +1/-1 (0 each for a draw): TextArena's rewards are exactly that in most
            # games, but a few give scores (Poker's chips), which would break the zero-sum spec.
            margin = float((final or {}).get(0, 0.0)) - float((final or {}).get(1, 0.0))
            rewards = np.array([np.sign(margin), -np.sign(margin)], dtype=np.float32)
            self._returns += rewards
            self._done = True
        elif len(self._history) >= self.spec.max_length:
            self._done = self._truncated = True
        self._read()
        return rewards

    def record(self) -> TextGameRecord:
        self._need_env()
        return TextGameRecord(tuple(self._texts), tuple(self._invalid), self._error)

    def is_terminal(self) -> bool:
        return self._done and not self._truncated

    def is_truncated(self) -> bool:
        return self._truncated

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        """Actions applied, in order; a move played as text is -1 (its text is in `record()`)."""
        return tuple(self._history)

    def render(self) -> str:
        if self._env is None or not hasattr(self, "_history"):
            return f"{self.spec.id} (not started)"
        board = getattr(self._env, "get_board_str", None)
        if callable(board):
            try:
                return str(board())
            except Exception:  # a board that cannot draw itself mid-game: show the text instead
                pass
        seat = self._current if self._current is not None else 0
        return self._seen[seat][-2000:]


def make_textarena_game(text: str) -> TextArenaGame:
    return TextArenaGame(text)


def describe_layout(game: TextArenaGame) -> list[str]:
    """`ludus games --describe` lines of a ``ta:`` game (the adapter record's `layout` hook)."""
    lines = [f"observation: the seat's TextArena observation text as UTF-8 bytes, zero-padded to "
             f"{game.max_bytes} (a longer text keeps its head and tail around '[...]')"]
    if game.facts.moves:
        lines.append("actions: the answers " + ", ".join(f"{i} [{m}]" for i, m in enumerate(game.facts.moves))
                     + "; those TextArena would reject now are masked; a text agent may also answer in free text")
    else:
        lines.append("moves: free text, judged by TextArena (its error allowance: an invalid move is told why and "
                     "tried again, then loses); action 0 is the empty move, so only text agents play this game")
    return lines


def speakers_as_names(text: str) -> str:
    """TextArena's text with each message's speaker tag written ``GAME:`` instead of ``[GAME]``.

    TextArena writes speaker tags in the square brackets that also hold a move, and a small model
    copies the first bracketed word it reads: SmolLM2-135M answered ``[GAME]`` to all 24 Nim
    openings of a probe with the tags in brackets; with them written as names, 9 of its 24
    answers were moves TextArena accepts (PigDice: 1 and 24 of 24). Only the prompt changes: the
    game, its observation and what the opponent hears stay TextArena's."""
    return _SPEAKER.sub(r"\1:", text)


@dataclasses.dataclass(frozen=True)
class TextArenaView:
    """A ``ta:`` game told as TextArena tells it: the observation is TextArena's own text, so the
    view adds the legal moves where the game lists them, and writes speaker tags as names
    (`speakers_as_names`) (a `ludus.games.text.TextView`)."""

    game_id: str
    title: str
    moves: tuple[str, ...]
    """The game's move list: action i is the answer ``[moves[i]]``; empty for free-text games."""

    @property
    def free_text(self) -> bool:
        """The game lists no moves: a response's answer is played as text, judged by the game."""
        return not self.moves

    def rules(self) -> str:
        if self.free_text:
            return (f"You are playing {self.title} from TextArena. The game's messages follow, with its rules "
                    f"and the format of a move. Answer with your move as the game asks.")
        return (f"You are playing {self.title} from TextArena. The game's messages follow. Answer with "
                f"exactly one move in square brackets, chosen from your legal moves.")

    def role(self, seat: int) -> str:
        return f"You are Player {seat}."

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        text = speakers_as_names(decode_text(obs).strip())
        if self.free_text:
            return text
        legal = " ".join(f"[{self.moves[a]}]" for a in np.flatnonzero(mask))
        return f"{text}\nYour legal moves: {legal}"

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        if self.free_text:
            return {}  # the game judges the text itself; its one action (the empty move) has no answer
        return {normal_answer(self.moves[a]): int(a) for a in np.flatnonzero(mask)}

    def normal_form(self, answer: str) -> str:
        return answer


def textarena_view(text: str) -> TextArenaView:
    """The text view of the ``ta:`` id ``ta:<text>`` (the adapter record's `text_view` hook)."""
    parts = _parse(text)
    facts = textarena_facts(parts.env_id, parts.max_steps)
    return TextArenaView(f"ta:{parts.env_id}{parts.suffix}", parts.env_id, facts.moves)
