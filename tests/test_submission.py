"""Submission validation: every kind is accepted when right and refused with one line when wrong."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from ludus.arena.sandbox.isolation import Isolation, SandboxConfig, resolve_isolation
from ludus.arena.match import SandboxedAgent
from ludus.arena.match import make_player
from ludus.arena.submission import SubmissionError, SubmissionKind, validate_submission
from ludus.games import registry

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "agents"
ZOO = REPO / "tests" / "hostile_agents"
GAME = "tic_tac_toe"


def require_isolation() -> None:
    if resolve_isolation(SandboxConfig()) == Isolation.NONE:
        message = "entry points are checked in a sandbox: needs root or user namespaces"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)


def folder(tmp_path: Path, manifest: str, files: dict[str, str] | None = None) -> Path:
    root = tmp_path / "sub"
    root.mkdir(parents=True)
    (root / "agent.toml").write_text(manifest)
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    return root


GOOD_MANIFEST = 'name = "mine"\nversion = "2.0"\ngame = "tic_tac_toe"\nentry_point = "agent:Agent"\n'
GOOD_AGENT = "class Agent:\n    def act(self, observation, legal_actions):\n        return legal_actions[0]\n"


def refused(path, match: str, game_id: str | None = GAME, **kwargs) -> str:
    with pytest.raises(SubmissionError, match=match) as info:
        validate_submission(path, game_id, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- Python folders


def test_python_folder_is_accepted(tmp_path):
    require_isolation()
    root = folder(tmp_path, GOOD_MANIFEST, {"agent.py": GOOD_AGENT})
    sub = validate_submission(root, GAME)
    assert sub.kind == SubmissionKind.PYTHON_FOLDER and sub.name == "mine" and sub.version == "2.0"
    assert sub.game == GAME and sub.entry_point == "agent:Agent" and sub.path == root.resolve()
    assert len(sub.digest) == 64 and validate_submission(root, GAME).digest == sub.digest
    (root / "agent.py").write_text(GOOD_AGENT + "# changed\n")
    assert validate_submission(root, GAME).digest != sub.digest


def test_any_game_folder_and_function_entry_point():
    require_isolation()
    sub = validate_submission(EXAMPLES / "random_python", "connect_four")
    assert sub.game is None  # game = "*"
    assert validate_submission(ZOO / "infinite_loop", GAME).entry_point == "agent:act"


@pytest.mark.parametrize("manifest, match", [
    ("name = 'x'\nversion = '1'\ngame = 'tic_tac_toe'\nentry_point = 'agent:Agent'\nextra = 1\n", "unknown keys"),
    ("name = 'x'\ngame = 'tic_tac_toe'\nentry_point = 'agent:Agent'\n", "'version' must be"),
    ("name = 'x'\nversion = '1'\ngame = 'tic_tac_toe'\n", "exactly one of entry_point"),
    ("name = 'x y'\nversion = '1'\ngame = 'tic_tac_toe'\nentry_point = 'agent:Agent'\n", "letters, digits"),
    ("name = 'x'\nversion = '1'\ngame = 'tic_tac_toe'\nentry_point = 'agent.Agent'\n", "module:Attribute"),
    ("name = 'x'\nversion = '1'\ngame = 'tic_tac_toe'\nentry_point = 'nothere:Agent'\n", "unknown entry point"),
    ("name = 'x'\nversion = '1'\ngame = 'no_such_game'\nentry_point = 'agent:Agent'\n", "unknown game"),
    ("name = 'x\nversion = '1'\n", "malformed manifest"),
])
def test_malformed_manifest_is_refused(tmp_path, manifest, match):
    refused(folder(tmp_path, manifest, {"agent.py": GOOD_AGENT}), match, game_id=None)


def test_missing_manifest_is_refused(tmp_path):
    (tmp_path / "agent.py").write_text(GOOD_AGENT)
    refused(tmp_path, "has no agent.toml")


def test_wrong_game_is_refused(tmp_path):
    root = folder(tmp_path, GOOD_MANIFEST.replace("tic_tac_toe", "connect_four"), {"agent.py": GOOD_AGENT})
    refused(root, "plays 'connect_four', not 'tic_tac_toe'")


def test_unknown_attribute_is_found_by_importing_in_a_sandbox(tmp_path):
    require_isolation()
    root = folder(tmp_path, GOOD_MANIFEST.replace("agent:Agent", "agent:Missing"), {"agent.py": GOOD_AGENT})
    refused(root, "AttributeError")


def test_entry_point_is_imported_in_a_sandbox_not_here(tmp_path):
    """Importing a stranger's module at submit time happens in a sandboxed process."""
    require_isolation()
    marker = tmp_path / "imported-in-the-arena"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n" + GOOD_AGENT
    root = folder(tmp_path, GOOD_MANIFEST.replace("agent:Agent", "ludus_probe_module_q7:Agent"),
                  {"ludus_probe_module_q7.py": code})
    refused(root, "ludus_probe_module_q7|Errno|denied|No such file")  # its write failed in the sandbox
    assert "ludus_probe_module_q7" not in sys.modules and not marker.exists()


def test_crash_at_import_and_non_callable_act_are_refused(tmp_path):
    require_isolation()
    refused(ZOO / "crash_at_import", "RuntimeError: hostile crash at import")
    root = folder(tmp_path, GOOD_MANIFEST, {"agent.py": "class Agent:\n    act = 3\n"})
    refused(root, "neither an act function nor a class")


def test_slow_import_is_refused(tmp_path):
    require_isolation()
    root = folder(tmp_path, GOOD_MANIFEST, {"agent.py": "import time\ntime.sleep(30)\n" + GOOD_AGENT})
    refused(root, "took longer than 1 s", check_timeout_s=1.0)


def test_symlinks_are_refused(tmp_path):
    root = folder(tmp_path, GOOD_MANIFEST, {"agent.py": GOOD_AGENT})
    (root / "passwords").symlink_to("/etc/passwd")
    refused(root, "is a symlink")


# -------------------------------------------------------------------------------- executables


def test_executable_folder_and_lone_executable(tmp_path):
    sub = validate_submission(EXAMPLES / "random_sh", GAME)
    assert sub.kind == SubmissionKind.EXECUTABLE and sub.executable == "agent.sh" and sub.name == "random-sh"
    lone = tmp_path / "bot.sh"
    shutil.copy(EXAMPLES / "random_sh" / "agent.sh", lone)
    os.chmod(lone, 0o755)
    sub = validate_submission(lone, GAME)
    assert sub.kind == SubmissionKind.EXECUTABLE and sub.executable == "bot.sh" and sub.game is None


def test_non_executable_file_is_refused(tmp_path):
    script = tmp_path / "bot.sh"
    script.write_text("#!/bin/sh\n")
    os.chmod(script, 0o644)
    refused(script, "not executable")
    root = folder(tmp_path, GOOD_MANIFEST.replace('entry_point = "agent:Agent"', 'executable = "run.sh"'),
                  {"run.sh": "#!/bin/sh\n"})
    refused(root, "not executable")
    refused(folder(tmp_path / "b", GOOD_MANIFEST.replace('entry_point = "agent:Agent"', 'executable = "../x"')),
            "not a file inside the folder")


# ---------------------------------------------------------------------------------- snapshots


@pytest.fixture()
def snapshot(tmp_path):
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot

    spec = registry.spec(GAME)
    torch.manual_seed(0)
    config = NetConfig(hidden=(8,))
    ref = save_snapshot(ActorCritic(spec, config), spec, config, tmp_path / "snap")
    return ref


def test_snapshot_manifest_name_matches_the_snapshot_format():
    from ludus.agents.snapshot import MANIFEST_NAME
    from ludus.arena.submission import SNAPSHOT_MANIFEST

    assert SNAPSHOT_MANIFEST == MANIFEST_NAME


def test_snapshot_is_accepted(snapshot):
    require_isolation()
    sub = validate_submission(snapshot.path, GAME)
    assert sub.kind == SubmissionKind.SNAPSHOT and sub.game == GAME and sub.digest == snapshot.snapshot_id


def test_corrupt_or_foreign_snapshot_is_refused(snapshot, tmp_path):
    refused(snapshot.path, "plays 'tic_tac_toe', not 'connect_four'", game_id="connect_four")
    tampered = tmp_path / "tampered"
    shutil.copytree(snapshot.path, tampered)
    weights = tampered / "weights.safetensors"
    os.chmod(weights, 0o644)
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    refused(tampered, "unreadable snapshot: hash mismatch")
    broken = tmp_path / "broken"
    shutil.copytree(snapshot.path, broken)
    manifest = broken / "manifest.json"
    os.chmod(manifest, 0o644)
    manifest.write_text(json.dumps({"format_version": 1}))
    refused(broken, "unreadable snapshot: malformed manifest")
    (broken / "manifest.json").unlink()
    refused(broken, "no agent.toml .*, no manifest.json .* and no mixture.json")


# ---------------------------------------------------------------------------------- built-ins


def test_builtin_bots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("random", "mcts-20", "perfect"):
        sub = validate_submission(name, GAME)
        assert sub.kind == SubmissionKind.BUILTIN and sub.bot == name and sub.path is None
    refused("perfect", "tic-tac-toe only", game_id="connect_four")
    refused("randomm", "no submission at 'randomm'")
    player = make_player(validate_submission("random", GAME), GAME)
    assert not isinstance(player, SandboxedAgent) and hasattr(player, "act")


def test_make_player_refuses_the_wrong_game():
    sub = validate_submission(EXAMPLES / "random_sh", None)
    with make_player(sub, "connect_four") as agent:  # game "*": any game
        assert isinstance(agent, SandboxedAgent) and agent.game_id == "connect_four"
    pinned = sub.__class__(**{**sub.__dict__, "game": GAME})
    with pytest.raises(SubmissionError, match="not 'connect_four'"):
        make_player(pinned, "connect_four")


# ----------------------------------------------------------------------------- game ids from strangers


@pytest.mark.parametrize("game", ["pz:evilmod.env", "gym:evilmod:Evil-v0"])
def test_a_submission_cannot_make_the_host_import_its_game(tmp_path, monkeypatch, game):
    """tests/hostile_agents/host_import names a game by module path; evilmod.py beside it is
    importable in the host (on sys.path, as a local package is under `python -m ludus`). An arena
    with no game yet must refuse the id without resolving it: the canary proves no import ran."""
    zoo = tmp_path / "zoo"
    shutil.copytree(ZOO / "host_import", zoo)
    (zoo / "agent.toml").write_text((zoo / "agent.toml").read_text().replace("pz:evilmod.env", game))
    canary = tmp_path / "canary"
    monkeypatch.setenv("LUDUS_CANARY", str(canary))
    monkeypatch.syspath_prepend(str(zoo))
    from ludus.arena.api import Arena, ArenaError

    arena_dir = tmp_path / "arena"
    with pytest.raises((SubmissionError, ArenaError), match="only the arena's operator|only the operator") as info:
        Arena.open(arena_dir).submit(zoo)
    assert "\n" not in str(info.value)
    assert not canary.exists() and "evilmod" not in sys.modules
    assert not arena_dir.exists()  # nothing stored


def test_host_import_submission_through_the_cli(tmp_path):
    """The same through `ludus arena submit` with the hostile folder on PYTHONPATH: exit 2, one line."""
    import subprocess

    canary = tmp_path / "canary"
    env = dict(os.environ, LUDUS_CANARY=str(canary),
               PYTHONPATH=os.pathsep.join([str(REPO), str(ZOO / "host_import")]))
    proc = subprocess.run([sys.executable, "-m", "ludus", "arena", "submit", str(ZOO / "host_import"),
                           "--arena", str(tmp_path / "arena")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "operator" in proc.stderr
    assert not canary.exists() and not (tmp_path / "arena").exists()


def test_an_operator_chosen_module_game_is_compared_not_resolved(tmp_path):
    """With the arena's game set by its operator, a submission's id is only compared as a string."""
    root = folder(tmp_path, GOOD_MANIFEST.replace("tic_tac_toe", "pz:evilmod.env"), {"agent.py": GOOD_AGENT})
    refused(root, "plays 'pz:evilmod.env', not 'tic_tac_toe'")


# ------------------------------------------------------------------- text fields and hard links

FORGED_ROW = "1\n  FORGED-ENTRANT  submission python 9.9 digest 000000000000  2026-01-01 00:00  /trusted"
FIELDS = {  # a good manifest's value of each text field, for the field under test to replace
    "name": "mine", "version": "2.0", "game": "tic_tac_toe", "entry_point": "agent:Agent", "description": "ok",
}


def manifest_with(field: str, value: str) -> str:
    values = dict(FIELDS, **{field: value})
    return "".join(f"{key} = {json.dumps(text)}\n" for key, text in values.items())  # JSON escapes are TOML's


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("char, described", [("\n", "U+000A"), ("\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),
                                             ("\u2028", "U+2028 LINE SEPARATOR"), ("\x1b", "U+001B"),
                                             ("\x85", "U+0085")])
def test_a_manifest_field_that_is_not_one_line_of_plain_text_is_refused(tmp_path, field, char, described):
    """A newline in a field forged a row of `ludus arena list`; U+202E and U+2028 printed raw.
    Refused before anything runs, naming the field and the character; a trailing one too ("mine\\n"
    matched the old name pattern, whose `$` accepts a final newline)."""
    for i, value in enumerate([FIELDS[field] + char, FORGED_ROW.replace("\n", char)]):
        root = folder(tmp_path / str(i), manifest_with(field, value), {"agent.py": GOOD_AGENT})
        message = refused(root, f"'{field}' holds {re.escape(described)}")
        assert char not in message


def test_the_forged_row_manifest_is_refused_by_the_cli_and_nothing_is_stored(tmp_path, ludus_here):
    """The issue's reproduction through `ludus arena submit`: exit 2, one line, the arena as it was."""
    arena_dir = tmp_path / "arena"
    assert ludus_here("arena", "submit", "bot:random", "--game", GAME, "--arena", str(arena_dir)).returncode == 0
    before = tree_digest(arena_dir)
    root = folder(tmp_path, manifest_with("version", FORGED_ROW), {"agent.py": GOOD_AGENT})
    done = ludus_here("arena", "submit", str(root), "--arena", str(arena_dir))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "'version' holds U+000A" in done.stderr, done.stderr
    assert "FORGED-ENTRANT" not in done.stderr  # the message names the field; it does not echo the value
    assert tree_digest(arena_dir) == before
    listing = ludus_here("arena", "list", "--arena", str(arena_dir)).stdout
    assert "FORGED-ENTRANT" not in listing and len(listing.splitlines()) == 2  # header + the bot


def tree_digest(root: Path) -> str:
    """sha256 over every path under `root` with its mode and (files) bytes."""
    import hashlib
    import stat

    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        h.update(f"{path.relative_to(root)}\0{st.st_mode}\0".encode())
        if stat.S_ISREG(st.st_mode):
            h.update(path.read_bytes())
    return h.hexdigest()


def test_a_non_string_text_field_is_refused(tmp_path):
    root = folder(tmp_path, GOOD_MANIFEST + "description = 5\n", {"agent.py": GOOD_AGENT})
    refused(root, "'description' must be a string", game_id=None)


def test_a_hard_link_in_a_folder_is_refused_and_nothing_is_stored(tmp_path):
    """A second name of a host file inside the folder would copy the host file into the arena's
    store (and hand it to the agent): refused like a symlink, naming the file, before any copy."""
    from ludus.arena.api import Arena

    secret = tmp_path / "host-secret"
    secret.write_text("the operator's private key\n")
    root = folder(tmp_path, GOOD_MANIFEST, {"agent.py": GOOD_AGENT})
    os.link(secret, root / "notes.txt")
    refused(root, f"{re.escape(str(root / 'notes.txt'))} has 2 hard links")
    arena_dir = tmp_path / "arena"
    arena = Arena.open(arena_dir, GAME)
    arena.submit("bot:random")
    before = tree_digest(arena_dir)
    with pytest.raises(SubmissionError, match="notes.txt has 2 hard links") as info:
        arena.submit(root)
    assert "\n" not in str(info.value) and tree_digest(arena_dir) == before
    assert not any(b"private key" in p.read_bytes() for p in arena_dir.rglob("*") if p.is_file())
    # two names of one file, both inside the folder: refused all the same (st_nlink cannot tell)
    (root / "notes.txt").unlink()
    os.link(root / "agent.py", root / "agent_copy.py")
    refused(root, "agent_copy.py has 2 hard links|agent.py has 2 hard links")
    # a lone executable with a second name
    lone = tmp_path / "bot.sh"
    shutil.copy(EXAMPLES / "random_sh" / "agent.sh", lone)
    os.chmod(lone, 0o755)
    os.link(lone, tmp_path / "bot-again.sh")
    refused(lone, "bot.sh has 2 hard links")
