"""Fuzzing the arena's two doors for strangers' text: manifests and protocol lines (issue 74).

Every generated input must end in a clean result or the arena's own one-line refusal, never an
unexpected exception: a manifest is accepted or refused with a one-line `SubmissionError` (through
the CLI: exit 2 and one line on stderr, the arena directory byte for byte as it was); an agent's
line decodes to a message or raises `ProtocolError` (which arena/match.py records as INVALID);
whatever a Python agent's act() returns becomes a line the decoder reads as that action only when
it is an integer. Bounded for the suite (`max_examples` small, derandomized so a run is
reproducible; 10 s on an idle 2-core machine, 25 s under a load of 4): no input here reaches a
sandbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ludus.arena import protocol
from ludus.arena.agent_host import action_line
from ludus.arena.api import Arena
from ludus.arena.submission import Submission, SubmissionError, SubmissionKind, validate_submission
from ludus.text import unsafe_character

REPO = Path(__file__).resolve().parent.parent
RANDOM_SH = REPO / "examples" / "agents" / "random_sh"
GAME = "tic_tac_toe"
NUM_ACTIONS = 9

# derandomize: the same examples every run (CI must not pass or fail by luck); database=None: no
# .hypothesis directory left in the checkout
FAST = settings(max_examples=300, deadline=None, derandomize=True, database=None)
FILES = settings(max_examples=150, deadline=None, derandomize=True, database=None)
"""For examples that write a folder and validate it (~10 ms each when idle)."""
SLOW = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

NASTY = ["\n", "\r", "\t", "\x00", "\x1b[2J", "\x7f", "\x85", "\x9b", "\u061c", "\u200f", "\u202e", "\u2066",
         "\u2028", "\u2029"]
"""Characters a one-line field must not hold (`ludus.text.one_line` escapes each)."""


# ------------------------------------------------------------------------------------ manifests

KEYS = ["name", "version", "game", "executable", "entry_point", "description", "extra"]
DELETE = object()


def _fuzzed() -> st.SearchStrategy:
    return st.one_of(
        st.text(max_size=30),  # any characters but surrogates, controls included
        st.tuples(st.sampled_from(["1", "fz", "run.sh", "*"]), st.sampled_from(NASTY), st.text(max_size=8))
          .map("".join),  # "1\n  forged row"
        st.sampled_from(["run.sh", "agent:Agent", "tic_tac_toe", "connect_four", "pz:evilmod.env", "../x", ""]),
        st.integers(-3, 3), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
    )


@st.composite
def _manifest(draw) -> dict:
    """A good executable manifest with up to three of its keys deleted, replaced or added: often
    accepted, often refused for one reason, sometimes for several."""
    manifest = {"name": draw(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)),
                "version": draw(st.sampled_from(["1", "2.0-beta"])), "game": draw(st.sampled_from(["*", GAME])),
                "executable": "run.sh", "description": "an agent"}
    for key, value in draw(st.lists(st.tuples(st.sampled_from(KEYS), st.just(DELETE) | _fuzzed()), max_size=3)):
        if value is DELETE:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    return manifest


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # JSON's escapes are TOML's; ensure_ascii=False keeps characters above U+FFFF out of the
    # surrogate-pair escapes TOML refuses (DEL stays raw, which TOML refuses: a malformed manifest)
    return json.dumps(value, ensure_ascii=False)


MANIFESTS = st.one_of(_manifest(), _manifest(), _manifest(),
                      st.binary(max_size=120))  # not TOML at all, or not UTF-8


def _write_folder(root: Path, manifest: dict | bytes) -> None:
    root.mkdir()
    data = manifest if isinstance(manifest, bytes) else \
        "".join(f"{k} = {_toml_value(v)}\n" for k, v in manifest.items()).encode("utf-8")
    (root / "agent.toml").write_bytes(data)
    # an executable agent: accepted manifests are checked without a sandbox (no entry point to import)
    (root / "run.sh").write_bytes((RANDOM_SH / "agent.sh").read_bytes())
    os.chmod(root / "run.sh", 0o755)


def _holds_unsafe_text(manifest: dict | bytes) -> bool:
    if isinstance(manifest, bytes):
        return False  # parsing decides; the property below needs only the dict case
    return any(isinstance(v, str) and unsafe_character(v) is not None for v in manifest.values())


def _reason(message: str) -> str:
    """The kind of a refusal, without its paths and values (for `event` statistics)."""
    words = [w for w in message.replace(":", " ").split() if "/" not in w and "'" not in w]
    return " ".join(words[:6])


def _assert_one_line(message: str) -> None:
    assert message and "\n" not in message and unsafe_character(message) is None, repr(message)


@FILES
@given(manifest=MANIFESTS)
def test_a_manifest_is_accepted_or_refused_with_one_line(manifest):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sub"
        _write_folder(root, manifest)
        try:
            submission = validate_submission(root, GAME)
        except SubmissionError as exc:
            _assert_one_line(str(exc))
            event(f"refused: {_reason(str(exc))}")  # --hypothesis-show-statistics: what was reached
            return
    event("accepted")
    # accepted: every text field it carries is one line of plain text
    assert not _holds_unsafe_text(manifest), manifest
    assert submission.kind == SubmissionKind.EXECUTABLE and submission.executable == "run.sh"
    assert all(unsafe_character(text) is None for text in (submission.name, submission.version))


def tree_digest(root: Path) -> str:
    """sha256 over every path under `root` with its mode and (files) bytes."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st_ = os.lstat(path)
        h.update(f"{path.relative_to(root)}\0{st_.st_mode}\0".encode())
        if stat.S_ISREG(st_.st_mode):
            h.update(path.read_bytes())
    return h.hexdigest()


def ludus(*args: str) -> tuple[int, str, str]:
    """`ludus ARGS...` in this process (exit code, stdout, stderr): a new interpreter per example
    would cost seconds (see the `ludus_here` fixture, which is function-scoped and so not usable
    under @given)."""
    from ludus.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def fuzz_arena(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("fuzz") / "arena"
    assert ludus("arena", "submit", "bot:random", "--game", GAME, "--arena", str(directory))[0] == 0
    return directory


@SLOW
@given(manifest=MANIFESTS)
def test_cli_submit_enters_or_refuses_with_exit_2_and_one_line_and_changes_nothing(fuzz_arena, manifest):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sub"
        _write_folder(root, manifest)
        before = tree_digest(fuzz_arena)
        code, out, err = ludus("arena", "submit", str(root), "--arena", str(fuzz_arena))
    event("entered" if code == 0 else f"exit {code}")
    if code == 0:
        assert not _holds_unsafe_text(manifest) and err == "" and 1 <= out.count("\n") <= 2, (out, err)
    else:
        assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("ludus: error: "), (code, err)
        _assert_one_line(err.rstrip("\n"))
        assert tree_digest(fuzz_arena) == before
    code, out, err = ludus("arena", "list", "--arena", str(fuzz_arena))
    entrants = Arena.open(fuzz_arena).list()
    assert code == 0 and len(out.splitlines()) == 1 + len(entrants), out  # a header, one row each


_names = (f"stored-{i}" for i in itertools.count())
RANDOM_SH_DIGEST = validate_submission(RANDOM_SH, GAME).digest


@SLOW
@given(version=st.one_of(st.text(max_size=30), st.tuples(st.text(max_size=5), st.sampled_from(NASTY),
                                                         st.text(max_size=20)).map("".join)))
def test_a_stored_version_of_any_text_lists_as_one_row(fuzz_arena, version):
    """Entered without validation (an arena stored before submit refused such fields): whatever the
    version holds, surrogates included, `ludus arena list` prints one row per entrant, escaped."""
    arena = Arena.open(fuzz_arena)
    arena.enter(Submission(SubmissionKind.EXECUTABLE, next(_names), version, None, RANDOM_SH, RANDOM_SH_DIGEST,
                           executable="agent.sh"))
    code, out, _ = ludus("arena", "list", "--arena", str(fuzz_arena))
    assert code == 0 and len(out.splitlines()) == 1 + len(arena.list()), out
    assert all(unsafe_character(line) is None for line in out.splitlines())


# ------------------------------------------------------------------------------ protocol lines

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=False, allow_subnormal=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8)
ACTION_VALUES = st.one_of(st.integers(0, NUM_ACTIONS - 1), st.integers(-2, NUM_ACTIONS + 1), st.integers(), st.floats(allow_subnormal=False), st.booleans(),
                          st.text(max_size=4), st.integers(0, 8).map(str), st.integers(0, 8).map(float),
                          st.none(), st.lists(st.integers(0, 8), max_size=2))
KEY_NAMES = st.sampled_from(["type", "action", "name", "match", "x", ""])
TYPES = st.sampled_from(["action", "ready", "hello", "act", "shutdown", "Action", ""])


def _pair_value(key: str) -> st.SearchStrategy:
    return {"type": TYPES, "action": ACTION_VALUES, "name": st.text(max_size=110)}.get(key, JSON_VALUES)


def _render(pairs: list[tuple[str, object]]) -> bytes:
    """An object written pair by pair, so a key may appear twice (json.dumps of a dict cannot)."""
    return ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}").encode()


PAIR = KEY_NAMES.flatmap(lambda k: st.tuples(st.just(k), _pair_value(k)))
PAIRS = st.lists(PAIR, max_size=4)
# a well-formed answer, or one with a pair added (a duplicate or unknown key), in any key order
ANSWERS = st.tuples(
    st.one_of(st.tuples(st.just(("type", "action")), st.tuples(st.just("action"), ACTION_VALUES)),
              st.tuples(st.just(("type", "ready")), st.tuples(st.just("name"), st.text(max_size=110)))),
    st.one_of(st.just([]), st.just([]), st.lists(PAIR, min_size=1, max_size=1)),
).flatmap(lambda t: st.permutations([*t[0], *t[1]]))
LINES = st.one_of(
    ANSWERS.map(_render), ANSWERS.map(_render), ANSWERS.map(_render),
    PAIRS.map(_render),
    PAIRS.map(_render).map(lambda b: b + b"\n"),
    st.tuples(ACTION_VALUES, ACTION_VALUES).map(
        lambda a: _render([("type", "action"), ("action", a[0]), ("action", a[1])])),  # duplicate key
    st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES),
    st.binary(max_size=80),
    st.sampled_from([b'{"type":"action","action":NaN}', b'{"type":"action","action":1e400}',
                     b'{"type":"action","action":' + b"9" * 5000 + b"}", b"[" * 5000 + b"]" * 5000,
                     b'{"type":"ready","name":"\\ud800"}', b'{"type":"action","action":4}\n{"type":"x"}']),
)


def _pairs_everywhere(text: str) -> list[list[tuple[str, object]]]:
    """Every object of a JSON text as its list of pairs (json keeps only the last of two keys)."""
    found: list[list[tuple[str, object]]] = []

    def hook(pairs):
        found.append(pairs)
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook)
    return found


@FAST
@given(line=LINES)
@example(line=b'{"type":"action","action":9,"action":0}')  # the cases, every run
@example(line=b'{"type":"action","action":"4"}')
@example(line=b'{"type":"action","action":4.7}')
@example(line=b'{"type":"action","action":4.0}')
@example(line=b'{"type":"action","action":true}')
def test_an_agent_line_decodes_to_a_message_or_a_protocol_error(line):
    try:
        message = protocol.decode_agent_line(line, NUM_ACTIONS)
    except protocol.ProtocolError as exc:  # what arena/match.py records as INVALID
        _assert_one_line(str(exc))
        event(f"ProtocolError: {_reason(str(exc))}")
        return
    event(type(message).__name__)
    # a message: one object with no key twice anywhere, exactly its keys, values of their types
    objects = _pairs_everywhere(line.decode("utf-8"))
    assert all(len({k for k, _ in pairs}) == len(pairs) for pairs in objects), line
    obj = dict(objects[-1])
    if isinstance(message, protocol.Action):
        assert set(obj) == {"type", "action"} and type(obj["action"]) is int, line
        assert 0 <= obj["action"] < NUM_ACTIONS and message.action == obj["action"]
    else:
        assert isinstance(message, protocol.Ready) and set(obj) == {"type", "name"}
        assert isinstance(obj["name"], str) and len(obj["name"]) <= protocol.MAX_NAME_CHARS


@FAST
@given(line=LINES)
def test_an_arena_line_decodes_to_a_message_or_a_protocol_error(line):
    """The decoder agents written in Python use (agent_host): strange input is a ProtocolError too."""
    try:
        protocol.decode_arena_line(line)
    except protocol.ProtocolError as exc:
        _assert_one_line(str(exc))


RETURNED = st.one_of(ACTION_VALUES, st.integers(-2, 12).map(np.int64), st.integers(0, 8).map(np.uint8),
                     st.floats(allow_subnormal=False).map(np.float64), st.booleans().map(np.bool_),
                     st.integers(0, 8).map(np.array), JSON_VALUES)


@FAST
@given(value=RETURNED)
def test_what_act_returns_is_an_action_only_when_it_is_an_integer(value):
    """agent_host's rule: an int or numpy integer (no bool) is the action; anything else reaches
    the arena as a line its decoder refuses, so the move is INVALID, never a coerced action."""
    line = action_line(value)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if integer and 0 <= int(value) < NUM_ACTIONS:
        assert protocol.decode_agent_line(line, NUM_ACTIONS) == protocol.Action(int(value))
    else:
        with pytest.raises(protocol.ProtocolError):
            protocol.decode_agent_line(line, NUM_ACTIONS)
