"""The arena's JSON-lines protocol, version 1 (docs/arena_protocol.md is the reference for authors).

An agent is a process that reads one JSON object per line on stdin and answers on stdout. One
process lives for a whole tournament and plays many matches:

    arena -> agent  {"type":"hello","protocol":1,"game":ID,"seat":s,"seed":n,"time_per_move_s":T,
                     "overage_s":O,"num_actions":A,"observation_shape":[...]}
    agent -> arena  {"type":"ready","name":NAME}
    per match:
    arena -> agent  {"type":"start","match":M,"seat":s,"seed":n,"time_per_move_s":T,"overage_s":O}
    per move:
    arena -> agent  {"type":"act","match":M,"observation":[...],"legal_actions":[...],"time_left_s":t}
    agent -> arena  {"type":"action","action":k}   or, in a text-move game,   {"type":"move","text":S}
    arena -> agent  {"type":"end","match":M,"returns":[...],"seat":s}
    arena -> agent  {"type":"shutdown"}

A game whose moves are text (TextArena's) adds ``"text_moves":true`` to ``hello`` (other games'
hello lines are unchanged): its observation is the seat's text as UTF-8 bytes, zero-padded, and
an agent may answer ``act`` with a ``move`` holding its move as text (at most
`MAX_MOVE_CHARS` characters), which the game judges; an ``action`` plays one of the game's
listed answers as before.

The agent speaks only when spoken to: exactly one ``ready`` after ``hello`` and exactly one
``action`` after each ``act``. The arena writes compact JSON (no spaces, keys in the order above)
so that even a shell script can pick fields out with pattern matching.

Both directions are validated strictly: a line longer than its cap, bytes that are not UTF-8,
JSON that is not an object, a key given twice in one object, an unknown ``type``, a missing or
extra key, or a value of the wrong type (an action is a JSON integer: not ``"4"``, ``4.7``,
``4.0`` or ``true``) is a `ProtocolError`. Agent lines are capped at `MAX_AGENT_LINE_BYTES`
(64 KiB: an action is a few bytes); arena lines at `MAX_ARENA_LINE_BYTES` (observations of big
games are long).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence, Union

PROTOCOL_VERSION = 1
MAX_AGENT_LINE_BYTES = 64 * 1024
"""Longest line (newline included) an agent may send."""
MAX_ARENA_LINE_BYTES = 16 * 1024 * 1024
"""Longest line the arena sends (an observation of 2M floats); agents may rely on it."""
MAX_NAME_CHARS = 100
"""Longest agent name accepted in ``ready``."""
MAX_MOVE_CHARS = 8192
"""Longest text move accepted in ``move`` (text-move games)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


class ProtocolError(ValueError):
    """A line that breaks the protocol; the message says which rule (one line)."""


# ------------------------------------------------------------------------------ message records


@dataclass(frozen=True)
class Hello:
    """First message to a new agent process: what it is going to play."""

    game: str
    """Registry id of the game, e.g. ``tic_tac_toe``."""
    seat: int
    """Seat of the first match (informational: ``start`` is authoritative for every match)."""
    seed: int
    """Seed for the agent's own randomness over its whole life."""
    time_per_move_s: float
    """Seconds per move before the overage bank is drawn on."""
    overage_s: float
    """Seconds of overage bank per match."""
    num_actions: int
    """Size of the action space; actions are 0..num_actions-1."""
    observation_shape: tuple[int, ...]
    """Shape of the observation; ``act`` sends it as a nested list of that shape."""
    text_moves: bool = False
    """The game's moves are text (``move`` answers; the observation is the seat's text as bytes)."""


@dataclass(frozen=True)
class Start:
    """A new match begins; the agent plays `seat`."""

    match: str
    seat: int
    seed: int
    """Seed for this match (an agent that seeds its RNG from it replays exactly)."""
    time_per_move_s: float
    overage_s: float


@dataclass(frozen=True)
class Act:
    """The arena asks for one action."""

    match: str
    observation: Any
    """Nested list of numbers, shape ``Hello.observation_shape``."""
    legal_actions: tuple[int, ...]
    """Legal action ids, increasing; the answer must be one of them."""
    time_left_s: float
    """Seconds the agent may take for this move (per-move limit plus what is left of the bank)."""


@dataclass(frozen=True)
class End:
    """The match is over; `returns` are the final returns per seat (forfeits included)."""

    match: str
    returns: tuple[float, ...]
    seat: int


@dataclass(frozen=True)
class Shutdown:
    """The tournament is over: exit now."""


@dataclass(frozen=True)
class Ready:
    """The agent's answer to ``hello``."""

    name: str


@dataclass(frozen=True)
class Action:
    """The agent's answer to ``act``."""

    action: int


@dataclass(frozen=True)
class Move:
    """The agent's answer to ``act`` in a text-move game: its move as text, judged by the game."""

    text: str


ArenaMessage = Union[Hello, Start, Act, End, Shutdown]
AgentMessage = Union[Ready, Action, Move]


# ------------------------------------------------------------------------------------ encoding


def _line(obj: dict) -> bytes:
    return (_ENCODER.encode(obj) + "\n").encode("ascii")


def encode_hello(msg: Hello) -> bytes:
    hello = {"type": "hello", "protocol": PROTOCOL_VERSION, "game": msg.game, "seat": msg.seat,
             "seed": msg.seed, "time_per_move_s": msg.time_per_move_s, "overage_s": msg.overage_s,
             "num_actions": msg.num_actions, "observation_shape": list(msg.observation_shape)}
    if msg.text_moves:
        hello["text_moves"] = True
    return _line(hello)


def encode_start(msg: Start) -> bytes:
    return _line({"type": "start", "match": msg.match, "seat": msg.seat, "seed": msg.seed,
                  "time_per_move_s": msg.time_per_move_s, "overage_s": msg.overage_s})


def encode_act(match: str, observation: Any, legal_actions: Sequence[int], time_left_s: float) -> bytes:
    """The hot path: `observation` is already a nested list (``ndarray.tolist()``)."""
    return _line({"type": "act", "match": match, "observation": observation,
                  "legal_actions": legal_actions, "time_left_s": round(time_left_s, 6)})


def encode_end(msg: End) -> bytes:
    return _line({"type": "end", "match": msg.match, "returns": list(msg.returns), "seat": msg.seat})


def encode_shutdown() -> bytes:
    return _line({"type": "shutdown"})


def encode_ready(name: str) -> bytes:
    return _line({"type": "ready", "name": name})


def encode_action(action: int) -> bytes:
    return b'{"type":"action","action":%d}\n' % action


def encode_move(text: str) -> bytes:
    return _line({"type": "move", "text": text})


# ------------------------------------------------------------------------------------ decoding


def _parse_object(line: bytes, limit: int) -> dict:
    if len(line) > limit:
        raise ProtocolError(f"line of {len(line)} bytes exceeds the {limit}-byte limit")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("line is not valid UTF-8") from None
    try:
        obj = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ProtocolError(f"key {_preview(exc.key)} appears twice in one object") from None
    except (ValueError, RecursionError):
        raise ProtocolError(f"line is not valid JSON: {_preview(text)}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"line is not a JSON object: {_preview(text)}")
    return obj


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads would keep the last of two equal keys: ``{"action":9,"action":0}`` read as 0 here
    and as 9 by a reader keeping the first. The protocol calls such an object malformed."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _preview(text: str, n: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= n else text[:n] + "...")


def _keys(obj: dict, kind: str, required: frozenset[str]) -> None:
    keys = set(obj)
    if keys != required:
        missing, extra = sorted(required - keys), sorted(keys - required)
        raise ProtocolError(f"{kind!r} message: missing keys {missing}, unknown keys {extra}")


def _int(obj: dict, key: str, kind: str, low: int | None = None, high: int | None = None) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{kind!r} message: {key} must be an integer, got {_preview(repr(value))}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ProtocolError(f"{kind!r} message: {key}={value} is out of range [{low}, {high}]")
    return value


def _float(obj: dict, key: str, kind: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{kind!r} message: {key} must be a finite number")
    return float(value)


def _str(obj: dict, key: str, kind: str, max_chars: int) -> str:
    value = obj[key]
    if not isinstance(value, str) or len(value) > max_chars:
        raise ProtocolError(f"{kind!r} message: {key} must be a string of at most {max_chars} characters")
    if _SURROGATE.search(value):  # JSON's "\ud800" alone is no character: it cannot be printed or stored
        raise ProtocolError(f"{kind!r} message: {key} holds a lone surrogate escape")
    return value


_READY_KEYS = frozenset({"type", "name"})
_ACTION_KEYS = frozenset({"type", "action"})


_MOVE_KEYS = frozenset({"type", "text"})


def decode_agent_line(line: bytes, num_actions: int, text_moves: bool = False) -> AgentMessage:
    """Parse and validate one line from an agent (newline included or not); ``move`` only in a
    game whose moves are text."""
    obj = _parse_object(line, MAX_AGENT_LINE_BYTES)
    kind = obj.get("type")
    if kind == "action":
        _keys(obj, "action", _ACTION_KEYS)
        return Action(_int(obj, "action", "action", 0, num_actions - 1))
    if kind == "move":
        if not text_moves:
            raise ProtocolError("'move' message in a game whose moves are actions: send 'action'")
        _keys(obj, "move", _MOVE_KEYS)
        text = _str(obj, "text", "move", MAX_MOVE_CHARS)
        if "\0" in text:
            raise ProtocolError("'move' message: text holds a NUL character")
        return Move(text)
    if kind == "ready":
        _keys(obj, "ready", _READY_KEYS)
        return Ready(_str(obj, "name", "ready", MAX_NAME_CHARS))
    raise ProtocolError(f"unknown agent message type {kind!r}: agents send 'ready', 'action' or (text-move "
                        f"games) 'move'")


_ARENA_KEYS = {
    "hello": frozenset({"type", "protocol", "game", "seat", "seed", "time_per_move_s", "overage_s",
                        "num_actions", "observation_shape"}),
    "start": frozenset({"type", "match", "seat", "seed", "time_per_move_s", "overage_s"}),
    "act": frozenset({"type", "match", "observation", "legal_actions", "time_left_s"}),
    "end": frozenset({"type", "match", "returns", "seat"}),
    "shutdown": frozenset({"type"}),
}


def decode_arena_line(line: bytes) -> ArenaMessage:
    """Parse and validate one line from the arena (agents written in Python use this)."""
    obj = _parse_object(line, MAX_ARENA_LINE_BYTES)
    kind = obj.get("type")
    if kind not in _ARENA_KEYS:
        raise ProtocolError(f"unknown arena message type {kind!r}")
    text_moves = kind == "hello" and obj.get("text_moves") is True
    _keys({k: v for k, v in obj.items() if not (text_moves and k == "text_moves")}, kind, _ARENA_KEYS[kind])
    if kind == "act":
        legal = obj["legal_actions"]
        if not isinstance(legal, list) or not legal or not all(
                isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in legal):
            raise ProtocolError("'act' message: legal_actions must be a non-empty list of action ids")
        if not isinstance(obj["observation"], list):
            raise ProtocolError("'act' message: observation must be a (nested) list")
        return Act(_str(obj, "match", kind, 200), obj["observation"], tuple(legal), _float(obj, "time_left_s", kind))
    if kind == "start":
        return Start(_str(obj, "match", kind, 200), _int(obj, "seat", kind, 0), _int(obj, "seed", kind, 0),
                     _float(obj, "time_per_move_s", kind), _float(obj, "overage_s", kind))
    if kind == "end":
        returns = obj["returns"]
        if not isinstance(returns, list) or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) for r in returns):
            raise ProtocolError("'end' message: returns must be a list of numbers")
        return End(_str(obj, "match", kind, 200), tuple(float(r) for r in returns), _int(obj, "seat", kind, 0))
    if kind == "hello":
        if obj["protocol"] != PROTOCOL_VERSION:
            raise ProtocolError(f"arena speaks protocol {obj['protocol']!r}, this agent speaks {PROTOCOL_VERSION}")
        shape = obj["observation_shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise ProtocolError("'hello' message: observation_shape must be a list of sizes")
        return Hello(_str(obj, "game", kind, 500), _int(obj, "seat", kind, 0), _int(obj, "seed", kind, 0),
                     _float(obj, "time_per_move_s", kind), _float(obj, "overage_s", kind),
                     _int(obj, "num_actions", kind, 1), tuple(shape), text_moves)
    return Shutdown()
