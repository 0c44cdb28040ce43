"""Arena submissions: what a person hands in, checked once at submit time.

Five kinds (`SubmissionKind`):

* a **Python folder** with ``agent.toml``::

      name = "my-agent"              # letters, digits, '.', '_', '-'
      version = "1.0"
      game = "tic_tac_toe"           # the registry id it plays, or "*" for any game
      entry_point = "agent:Agent"    # module:attribute, a class with act(...) or an act function
      description = "optional"

  run inside the sandbox by `ludus.arena.agent_host` (see docs/arena_protocol.md for the act signature);
* a folder with ``agent.toml`` naming ``executable = "run.sh"`` instead of ``entry_point``, or a
  lone **executable** file: any program speaking the JSON-lines protocol itself;
* a league **snapshot** directory (``manifest.json`` + ``weights.safetensors``, agents/snapshot.py),
  played by `ludus.arena.agent_host` with a `TorchPolicy`; never unpickled;
* a **mixture** directory (``mixture.json`` and the member snapshots inside it, agents/mixture.py;
  a league's output policy as ``ludus export --format mixture`` writes it): each match one member,
  drawn by weight, plays;
* a **built-in bot** by name (``random``, ``mcts-200``, ``perfect``; agents/bots/builtin.py), played
  in-process since it is our own code.

`validate_submission` refuses a bad submission with a one-line `SubmissionError`: missing or
malformed manifest, wrong game, an entry point that does not import (checked by importing it in
a sandboxed process, never in the arena's), a snapshot that fails its hashes or does not load
(loaded in a sandboxed process too), a file that is not executable, symlinks, special files, or
files with more than one hard link. Every text field of a manifest must be one line of plain text:
a control character (a newline included), a bidi override or a line separator in one is refused,
since these fields are printed in the operator's listings (`ludus.text.unsafe_character`).
"""

from __future__ import annotations

import enum
import json
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ludus.agents.mixture import MIXTURE_FILE
from ludus.errors import UserError
from ludus.files import files_digest
from ludus.text import unsafe_character

if TYPE_CHECKING:
    from ludus.arena.sandbox.isolation import SandboxConfig
    from ludus.arena.sandbox.limits import SandboxLimits

MANIFEST_NAME = "agent.toml"
SNAPSHOT_MANIFEST = "manifest.json"
"""ludus.agents.snapshot.MANIFEST_NAME, not imported from there: that module loads torch."""
MAX_MANIFEST_BYTES = 64 * 1024
MAX_FILES = 10_000
ANY_GAME = "*"
# used with fullmatch: `$` with match() also accepts a trailing newline ("mine\n")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ENTRY_RE = re.compile(r"(?P<module>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)")
_BOT_KINDS = ("random", "mcts", "perfect")
_BOT_RE = re.compile(r"(?P<kind>[a-z_]+)(-\d+)?(\([^()]*\))?")
_MANIFEST_KEYS = {"name", "version", "game", "entry_point", "executable", "description"}


class SubmissionError(UserError, ValueError):
    """A submission the arena refuses; the message names the problem and the fix."""


class SubmissionKind(str, enum.Enum):
    PYTHON_FOLDER = "python"
    EXECUTABLE = "executable"
    SNAPSHOT = "snapshot"
    MIXTURE = "mixture"
    BUILTIN = "builtin"


@dataclass(frozen=True)
class Submission:
    """A validated submission."""

    kind: SubmissionKind
    name: str
    version: str
    game: str | None
    """The game id it declares; None when it plays any game (a lone executable, ``game = "*"``, a bot)."""
    path: Path | None
    """Absolute path of the folder (or of the lone executable file); None for built-in bots."""
    digest: str
    """Identity of the content: sha256 over its files (a snapshot's id; ``builtin:<name>`` for bots)."""
    entry_point: str | None = None
    """``module:attribute`` of a Python folder."""
    executable: str | None = None
    """The program to run, relative to `path` (a lone executable: its file name)."""
    bot: str | None = None
    """The bot name of a built-in."""

    def argv(self, copy: Path) -> list[str]:
        """The command that runs this submission from its copy inside the sandbox (`copy`: where
        the folder, snapshot or file lives there). Python submissions run in `ludus.arena.agent_host`."""
        python = [sys.executable, "-B", "-s", "-m", "ludus.arena.agent_host"]
        if self.kind == SubmissionKind.PYTHON_FOLDER:
            return python + ["--folder", str(copy), "--entry", str(self.entry_point)]
        if self.kind == SubmissionKind.SNAPSHOT:
            return python + ["--snapshot", str(copy)]
        if self.kind == SubmissionKind.MIXTURE:
            return python + ["--mixture", str(copy)]
        if self.kind == SubmissionKind.EXECUTABLE:
            return [str(copy / str(self.executable))]
        raise SubmissionError(f"submission {self.name!r} is a built-in bot; it plays in-process, not sandboxed")


def _fail(message: str) -> NoReturn:
    raise SubmissionError(message)


def _scan_files(root: Path, max_bytes: int) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under `root`; refuses symlinks and special files."""
    files: list[tuple[str, Path]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                _fail(f"{path} is a symlink; copy the real file into the submission")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                _fail(f"{path} is not a regular file; submissions hold only files and directories")
            _refuse_hard_link(path, st)
            total += st.st_size
            files.append((str(path.relative_to(root)), path))
        if len(files) > MAX_FILES:
            _fail(f"submission {root} has more than {MAX_FILES} files")
        if total > max_bytes:
            _fail(f"submission {root} is larger than {max_bytes >> 20} MiB")
    return sorted(files)


def _refuse_hard_link(path: Path, st: os.stat_result) -> None:
    """A second name of a file may be a host file (root can link any file on the same filesystem
    into a folder it is asked to submit): its content would be copied into the arena's store and
    handed to the agent, as a symlink would, so it is refused like one."""
    if st.st_nlink > 1:
        _fail(f"{path} has {st.st_nlink} hard links; submit a copy of the file (`cp`), not another name of it")


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        _fail(f"malformed manifest {path}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        _fail(f"malformed manifest {path}: {str(exc).splitlines()[0]}")
    unknown = sorted(set(raw) - _MANIFEST_KEYS)
    if unknown:
        _fail(f"malformed manifest {path}: unknown keys {unknown}; allowed: {sorted(_MANIFEST_KEYS)}")
    for key in ("name", "version", "game"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            _fail(f"malformed manifest {path}: '{key}' must be a non-empty string")
    for key in sorted(raw):
        if not isinstance(raw[key], str):
            _fail(f"malformed manifest {path}: '{key}' must be a string")
        # the fields are printed in listings (`ludus arena list`, the service's pages): a newline
        # in one would forge a row, U+202E reverse what follows; refused here, escaped there too
        bad = unsafe_character(raw[key])
        if bad is not None:
            _fail(f"malformed manifest {path}: '{key}' holds {bad}; manifest fields are one line of plain text")
    if not _NAME_RE.fullmatch(raw["name"]):
        _fail(f"malformed manifest {path}: name {raw['name']!r} must be 1-100 letters, digits, '.', '_', '-'")
    if ("entry_point" in raw) == ("executable" in raw):
        _fail(f"malformed manifest {path}: give exactly one of entry_point = \"module:attr\" "
              f"or executable = \"program\"")
    return raw


def check_submission_game(declared: str | None, game_id: str | None, where: object) -> None:
    """A submission's game is a string compared with the arena's, never resolved on its own say.

    An arena with no game yet may take a native or ``spiel:`` id from a submission; an id that
    resolves by importing a module it names (``pz:``, ``gym:``) comes only from the operator
    (``--game``), else ``game = "pz:evilmod.env"`` would run evilmod in the host."""
    if declared is None:
        return
    if game_id is not None:
        if declared != game_id:
            _fail(f"{where} plays {declared!r}, not {game_id!r}: submit it to a {declared!r} arena or "
                  f"change its manifest")
        return
    from ludus.games import registry

    try:
        by_import = registry.resolves_by_import(declared)
    except UserError as exc:
        _fail(f"malformed manifest {where}: game: {exc}")
    if by_import:
        _fail(f"{where} names the game {declared!r}, which only the arena's operator may choose: create the "
              f"arena with `--game {declared}` first")


def _module_file(folder: Path, module: str) -> Path | None:
    base = folder.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _sandboxed_check(source: Path, extra_args: list[str], what: str, config: "SandboxConfig",
                     limits: "SandboxLimits", timeout_s: float) -> dict:
    """Run ``ludus.arena.agent_host --check`` on a copy of the submission inside a sandbox."""
    import sys

    from ludus.arena.sandbox.process import run_once

    python = [sys.executable, "-B", "-s", "-m", "ludus.arena.agent_host", "--check"]
    run = run_once(source, lambda copy: python + [a.replace("{copy}", str(copy)) for a in extra_args],
                   timeout_s, limits, config)
    if run.launch_error is not None:
        _fail(f"cannot check {what}: {run.launch_error}")
    lines = run.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict) or "ok" not in result:
        if run.exit_code is None:
            _fail(f"checking {what} took longer than {timeout_s:g} s (it must import quickly)")
        last = run.stderr_tail.strip().splitlines()[-1:] or [f"exit code {run.exit_code}"]
        _fail(f"{what} crashed while loading: {last[0][:300]}")
    if not result["ok"]:
        _fail(f"{what}: {str(result.get('error', 'unknown error'))[:400]}")
    return result


def validate_submission(path: str | os.PathLike, game_id: str | None = None, *,
                        config: "SandboxConfig | None" = None, limits: "SandboxLimits | None" = None,
                        check_timeout_s: float | None = None) -> Submission:
    """Check a submission and describe it; raises `SubmissionError` with a one-line reason.

    `game_id`: the arena's game; a submission declaring another game is refused. Entry points
    and snapshots are loaded in a sandboxed process (`config`, `limits`) within `check_timeout_s`,
    by default the sandbox's own `limits.startup_timeout_s`: an accepted agent can start in play.
    """
    from ludus.arena.sandbox.isolation import SandboxConfig
    from ludus.arena.sandbox.limits import SandboxLimits

    config = config or SandboxConfig()
    limits = limits or SandboxLimits()
    if check_timeout_s is None:
        check_timeout_s = limits.startup_timeout_s
    text = os.fspath(path)
    candidate = Path(text)
    if not os.path.lexists(candidate):
        match = _BOT_RE.fullmatch(text.strip())
        if match and match.group("kind") in _BOT_KINDS:
            return _builtin(text.strip(), game_id)
        _fail(f"no submission at {text!r}: give a folder with {MANIFEST_NAME}, a snapshot directory, "
              f"an executable file, or a bot name ({', '.join(_BOT_KINDS)}, mcts-N)")
    root = candidate.resolve()
    max_bytes = limits.max_submission_mb << 20
    if root.is_file():
        mode = root.stat().st_mode
        if not (mode & 0o111):
            _fail(f"{root} is not executable: `chmod +x {root}`, or submit a folder with {MANIFEST_NAME}")
        if root.stat().st_size > max_bytes:
            _fail(f"{root} is larger than {limits.max_submission_mb} MiB")
        _refuse_hard_link(root, root.stat())
        return Submission(SubmissionKind.EXECUTABLE, root.name, "0", None, root,
                          files_digest([(root.name, root)]), executable=root.name)
    if not root.is_dir():
        _fail(f"{root} is neither a folder nor a regular file")
    if (root / MANIFEST_NAME).exists():
        return _folder(root, game_id, config, limits, check_timeout_s, max_bytes)
    if (root / SNAPSHOT_MANIFEST).exists():
        return _snapshot(root, game_id, config, limits, check_timeout_s, max_bytes)
    if (root / MIXTURE_FILE).exists():
        return _mixture(root, game_id, config, limits, check_timeout_s, max_bytes)
    _fail(f"{root} has no {MANIFEST_NAME} (a Python or executable agent), no {SNAPSHOT_MANIFEST} "
          f"(a league snapshot) and no {MIXTURE_FILE} (a mixture, `ludus export --format mixture`): add one")


def _builtin(name: str, game_id: str | None) -> Submission:
    if game_id is not None:
        from ludus.agents.bots.builtin import BotError, make_bot
        from ludus.games import registry

        try:
            make_bot(name, registry.spec(game_id))
        except BotError as exc:
            _fail(str(exc))
    return Submission(SubmissionKind.BUILTIN, name, "builtin", None, None, f"builtin:{name}", bot=name)


def _folder(root: Path, game_id: str | None, config: "SandboxConfig", limits: "SandboxLimits",
            timeout_s: float, max_bytes: int) -> Submission:
    raw = _read_manifest(root)
    files = _scan_files(root, max_bytes)
    declared = None if raw["game"] == ANY_GAME else raw["game"]
    where = root / MANIFEST_NAME
    check_submission_game(declared, game_id, where)
    if declared is not None:
        from ludus.games import registry

        try:
            registry.spec(declared)
        except UserError as exc:
            _fail(f"malformed manifest {where}: game: {exc}")
    digest = files_digest(files)
    if "executable" in raw:
        program = raw["executable"]
        target = (root / program).resolve() if isinstance(program, str) else None
        if target is None or not str(target).startswith(str(root) + os.sep) or not target.is_file():
            _fail(f"malformed manifest {where}: executable {program!r} is not a file inside the folder")
        if not target.stat().st_mode & 0o111:
            _fail(f"{target} is not executable: `chmod +x {target}`")
        return Submission(SubmissionKind.EXECUTABLE, raw["name"], raw["version"], declared, root, digest,
                          executable=str(target.relative_to(root)))
    entry = raw["entry_point"]
    match = _ENTRY_RE.fullmatch(entry) if isinstance(entry, str) else None
    if not match:
        _fail(f"malformed manifest {where}: entry_point {entry!r} must look like 'module:Attribute'")
    if _module_file(root, match.group("module")) is None:
        _fail(f"unknown entry point {entry!r}: no module {match.group('module')!r} in {root}")
    game_args = ["--game", game_id or declared] if (game_id or declared) else []
    _sandboxed_check(root, ["--folder", "{copy}", "--entry", entry, *game_args], f"entry point {entry!r}",
                     config, limits, timeout_s)
    return Submission(SubmissionKind.PYTHON_FOLDER, raw["name"], raw["version"], declared, root, digest,
                      entry_point=entry)


def _snapshot(root: Path, game_id: str | None, config: "SandboxConfig", limits: "SandboxLimits",
              timeout_s: float, max_bytes: int) -> Submission:
    from ludus.agents.snapshot import KIND_LM_ADAPTER, SnapshotError, read_manifest, verify_snapshot
    from ludus.games.mix import plays

    _scan_files(root, max_bytes)
    try:
        manifest, _ = read_manifest(root)
        ref = verify_snapshot(root)
    except SnapshotError as exc:
        _fail(f"unreadable snapshot: {exc}")
    # an LM trained on several games plays any one of them alone (a string comparison of the ids)
    played = (game_id if game_id is not None and manifest.kind == KIND_LM_ADAPTER and plays(manifest.game_id, game_id)
              else manifest.game_id)
    check_submission_game(played, game_id, f"snapshot {root}")
    # the weights are parsed (safetensors, no pickle) in a sandbox, like every stranger's code path
    _sandboxed_check(root, ["--snapshot", "{copy}", "--game", played], f"snapshot {root}",
                     config, limits, timeout_s)
    return Submission(SubmissionKind.SNAPSHOT, source_name(root) or f"snapshot-{ref.snapshot_id[:12]}",
                      ref.snapshot_id[:12], played, root, ref.snapshot_id)


_SOURCE_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,60}")  # fullmatch, as _NAME_RE


def source_name(root: Path) -> str | None:
    """A league artefact's name after where it comes from: ``RUN/main@12`` for a run's snapshot,
    ``RUN/output_policy`` for its output policy (a run directory holds ``config.json``); None when
    the folder is not inside a run or the names do not make a valid entrant name."""
    if root.parent.name == "snapshots" and (root.parent.parent / "config.json").is_file():
        run, member = root.parent.parent.name, root.name
    elif (root.parent / "config.json").is_file() and (root.parent / "snapshots").is_dir():
        run, member = root.parent.name, root.name
    else:
        return None
    if _SOURCE_PART.fullmatch(run) and _SOURCE_PART.fullmatch(member) and "@" not in run:
        return f"{run}/{member}"
    return None


def _mixture(root: Path, game_id: str | None, config: "SandboxConfig", limits: "SandboxLimits",
             timeout_s: float, max_bytes: int) -> Submission:
    from ludus.agents.mixture import MixtureError, component_paths, read_mixture

    files = _scan_files(root, max_bytes)
    try:
        mixture = read_mixture(root)  # JSON and file hashes only; weights load in the sandbox
    except MixtureError as exc:
        _fail(f"unreadable mixture: {exc}")
    for component, path in zip(mixture.components, component_paths(root, mixture)):
        if path is not None and not Path(path).resolve().is_relative_to(root):
            _fail(f"mixture {root}: component {component.player_id!r} lies outside the folder; "
                  f"submit the self-contained copy `ludus export MIXTURE --format mixture --out DIR` writes")
    check_submission_game(mixture.game_id, game_id, f"mixture {root}")
    _sandboxed_check(root, ["--mixture", "{copy}", "--game", mixture.game_id], f"mixture {root}",
                     config, limits, timeout_s)
    digest = files_digest(files)
    return Submission(SubmissionKind.MIXTURE, source_name(root) or f"mixture-{digest[:12]}", digest[:12],
                      mixture.game_id, root, digest)
