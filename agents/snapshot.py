"""Snapshots: immutable, content-addressed saved agents that are safe to load from strangers.

Layout (format version 1) — a directory holding

* ``manifest.json``: one JSON object with exactly these keys
    - ``format_version``: 1
    - ``game``: the `GameSpec` (``GameSpec.to_json()``) the agent plays
    - ``game_id``: the registry id of that game (equal to ``game["id"]``)
    - ``kind``: what the weights are, a name in `SNAPSHOT_KINDS` (the one table of kinds:
      `register_snapshot_kind` adds one); ``"actor_critic"`` (a `ludus.agents.nets.ActorCritic`) or ``"lm"``
      (a causal language model with a value head, `ludus.agents.lm.model.LMWithValueHead`; see
      `ludus.agents.lm.snapshots.save_lm_snapshot`)
    - ``architecture``: how to rebuild the net (``NetConfig.to_json()`` for actor_critic, the
      ``ludus.agents.lm.model`` architecture record for lm)
    - ``lineage``: ``{"parent": snapshot id or null, "role": str, "steps": int, "created_by": str}``
    - ``files``: ``{file name: sha256 hex}`` for every other file of the snapshot
  written as canonical JSON (sorted keys, no whitespace, ASCII), so equal content gives equal bytes;
* ``weights.safetensors``: the tensors of the net's ``state_dict`` (safetensors, never pickle);
* any extra files listed in ``files`` (e.g. tokenizer files of an LM snapshot).

Identity: ``snapshot_id = sha256(canonical_json(sorted([[name, sha256(bytes of name)], ...])))``
over every file of the snapshot, ``manifest.json`` included. The manifest pins the hash of every
other file, so the id fixes every byte; neither the directory's path nor the time of saving enters
it, so the same agent saved in two places has the same id. Files in the directory that the manifest
does not list are not part of the snapshot and are ignored.

Loading never unpickles: JSON and safetensors only. Every way a snapshot can be broken (missing or
malformed manifest, unknown version, other game, missing file, hash mismatch, corrupt weights,
weights that do not fit the architecture) is refused with a one-line `SnapshotError`.
Snapshots are written atomically (a temporary directory renamed into place) and their files are
made read-only; saving different content over an existing snapshot is refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ludus.agents.nets import ActorCritic, NetConfig, shape_mismatch
from ludus.agents.policy import Policy
from ludus.agents.torch_policy import TorchPolicy
from ludus.games import registry
from ludus.games.core import GameSpec
from ludus.games.mix import plays
from ludus.games.registry import Lazy
from ludus.errors import UserError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "weights.safetensors"
KIND_ACTOR_CRITIC = "actor_critic"
KIND_LM = "lm"
KIND_LM_ADAPTER = "lm_adapter"
ADAPTER_WEIGHTS_NAME = "adapter.safetensors"
MANIFEST_KEYS = frozenset({"format_version", "game", "game_id", "kind", "architecture", "lineage", "files"})
MAX_MANIFEST_BYTES = 1 << 20
"""A manifest is a few kB; refusing larger ones keeps a hostile file from eating memory."""

_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class SnapshotError(UserError, ValueError):
    """A snapshot that cannot be saved or loaded; the message names the file and the fix."""


@dataclass(frozen=True)
class Lineage:
    """Where a snapshot comes from (for league bookkeeping and reports)."""

    parent: str | None = None
    """snapshot_id of the snapshot this one was trained from; None for a fresh start."""
    role: str = ""
    """League role of the agent that produced it, e.g. 'main', 'main_exploiter'."""
    steps: int = 0
    """Environment steps of training behind these weights."""
    created_by: str = ""
    """Who or what wrote it, e.g. 'ludus train 0.1.0' or a person's name."""

    def to_json(self) -> dict:
        return {"parent": self.parent, "role": self.role, "steps": self.steps, "created_by": self.created_by}

    @staticmethod
    def from_json(data: Any) -> "Lineage":
        if not isinstance(data, dict) or set(data) != {"parent", "role", "steps", "created_by"}:
            raise ValueError("lineage must be an object with keys parent, role, steps, created_by")
        parent, role, steps, created_by = data["parent"], data["role"], data["steps"], data["created_by"]
        if parent is not None and not (isinstance(parent, str) and _SHA256_RE.match(parent)):
            raise ValueError("lineage.parent must be a snapshot id (64 hex digits) or null")
        if not isinstance(role, str) or not isinstance(created_by, str):
            raise ValueError("lineage.role and lineage.created_by must be strings")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError("lineage.steps must be a non-negative integer")
        return Lineage(parent, role, steps, created_by)


@dataclass(frozen=True)
class SnapshotRef:
    """A saved snapshot: where it is and what it is."""

    path: Path
    """The snapshot directory."""
    snapshot_id: str
    """Content hash (see the module docstring)."""
    game_id: str
    """Registry id of the game it plays."""
    lineage: Lineage


@dataclass(frozen=True)
class SnapshotManifest:
    """The parsed, validated ``manifest.json``."""

    format_version: int
    game: GameSpec
    game_id: str
    kind: str
    architecture: Mapping[str, Any]
    """Raw architecture record; `NetConfig.from_json(architecture)` for kind 'actor_critic'."""
    lineage: Lineage
    files: tuple[tuple[str, str], ...]
    """(file name, sha256 hex) of every file besides the manifest, sorted by name."""


@dataclass(frozen=True)
class LoadedSnapshot:
    """A verified snapshot with its net rebuilt."""

    ref: SnapshotRef
    manifest: SnapshotManifest
    net_config: NetConfig
    net: ActorCritic
    """Rebuilt from `net_config` with the snapshot's weights, in eval mode."""

    @property
    def spec(self) -> GameSpec:
        return self.manifest.game


def canonical_json(value: Any) -> bytes:
    """The one byte encoding of a JSON value that manifests and ids use."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot_id_of(file_hashes: Mapping[str, str]) -> str:
    """snapshot_id from {file name: sha256 hex} of every file, manifest.json included."""
    return sha256_hex(canonical_json(sorted([name, digest] for name, digest in file_hashes.items())))


# ----------------------------------------------------------------------------------------- save


def write_snapshot(directory: str | os.PathLike, header: Mapping[str, Any], files: Mapping[str, bytes]) -> SnapshotRef:
    """Write a snapshot of any kind: `header` is the manifest without ``files``; `files` its other files.

    Atomic: everything is written to a temporary sibling directory, made read-only, then renamed
    into place. An existing snapshot with the same content is left as is and returned; an existing
    non-empty directory with other content is refused.
    """
    directory = Path(directory)
    for name in files:
        if name == MANIFEST_NAME or not _FILE_NAME_RE.match(name):
            raise SnapshotError(f"bad snapshot file name {name!r}: use letters, digits, '.', '_', '-'")
    hashes = {name: sha256_hex(data) for name, data in files.items()}
    manifest = dict(header, files=hashes)
    if set(manifest) != MANIFEST_KEYS:
        raise SnapshotError(f"snapshot header needs exactly the keys {sorted(MANIFEST_KEYS - {'files'})}")
    manifest_bytes = canonical_json(manifest)
    # Check the record we are about to write with the same parser that loads it.
    parsed = _parse_manifest(manifest_bytes, directory)
    snapshot_id = snapshot_id_of({**hashes, MANIFEST_NAME: sha256_hex(manifest_bytes)})
    ref = SnapshotRef(directory, snapshot_id, parsed.game_id, parsed.lineage)

    if directory.exists() and not _is_empty_dir(directory):
        return _same_or_refuse(directory, ref)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        for name, data in [*files.items(), (MANIFEST_NAME, manifest_bytes)]:
            path = tmp / name
            with open(path, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(path, 0o444)  # immutable: nobody edits a snapshot in place
        os.chmod(tmp, 0o755)
        try:
            os.replace(tmp, directory)  # rename(2) replaces only a missing or empty directory
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            return _same_or_refuse(directory, ref)  # another writer got there first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return ref


def save_snapshot(net_or_state_dict: ActorCritic | Mapping[str, torch.Tensor], spec: GameSpec,
                  net_config: NetConfig, directory: str | os.PathLike,
                  lineage: Lineage = Lineage()) -> SnapshotRef:
    """Freeze an actor-critic net (or its state_dict) into a snapshot directory.

    Tensors are cloned to CPU first, so the snapshot never shares storage with the learner.
    """
    if isinstance(net_or_state_dict, ActorCritic):
        if net_or_state_dict.spec != spec or net_or_state_dict.config != net_config:
            raise SnapshotError("save_snapshot: the net was built for another spec or NetConfig than the ones given")
        state = net_or_state_dict.state_dict()
    else:
        state = net_or_state_dict
    tensors = {name: t.detach().to(device="cpu", copy=True).contiguous() for name, t in state.items()}
    problem = _architecture_mismatch(spec, net_config, {k: tuple(t.shape) for k, t in tensors.items()})
    if problem:
        raise SnapshotError(f"save_snapshot: weights do not match the architecture: {problem}")
    from safetensors.torch import save as safetensors_bytes

    header = {
        "format_version": FORMAT_VERSION,
        "game": spec.to_json(),
        "game_id": spec.id,
        "kind": KIND_ACTOR_CRITIC,
        "architecture": net_config.to_json(),
        "lineage": lineage.to_json(),
    }
    return write_snapshot(directory, header, {WEIGHTS_NAME: safetensors_bytes(tensors)})


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def _same_or_refuse(directory: Path, ref: SnapshotRef) -> SnapshotRef:
    try:
        existing = verify_snapshot(directory)
    except SnapshotError:
        existing = None
    if existing is None or existing.snapshot_id != ref.snapshot_id:
        raise SnapshotError(f"{directory} already exists with other content; snapshots are immutable, "
                            f"save to a new directory")
    return existing


# ----------------------------------------------------------------------------------------- load


def _read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """Read a file of the snapshot, refusing symlinks and special files (a stranger's directory
    could point `weights.safetensors` at /dev/zero or at a file outside the snapshot)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SnapshotError(f"snapshot {path.parent} is missing the file {path.name}") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror} (symlinks are not allowed in snapshots)") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise SnapshotError(f"{path} is not a regular file")
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise SnapshotError(f"malformed manifest {path}: larger than {limit} bytes")
    return data


def _parse_manifest(data: bytes, directory: Path) -> SnapshotManifest:
    where = directory / MANIFEST_NAME
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SnapshotError(f"malformed manifest {where}: not valid JSON") from None
    if not isinstance(raw, dict):
        raise SnapshotError(f"malformed manifest {where}: expected a JSON object")
    version = raw.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise SnapshotError(f"unknown snapshot format version {version!r} in {where}: this Ludus reads "
                            f"version {FORMAT_VERSION}; use the Ludus version that wrote it")
    if set(raw) != MANIFEST_KEYS:
        missing, extra = sorted(MANIFEST_KEYS - set(raw)), sorted(set(raw) - MANIFEST_KEYS)
        raise SnapshotError(f"malformed manifest {where}: missing keys {missing}, unknown keys {extra}")
    try:
        game = GameSpec.from_json(raw["game"])
        lineage = Lineage.from_json(raw["lineage"])
    except (UserError, TypeError, ValueError, AttributeError) as exc:
        raise SnapshotError(f"malformed manifest {where}: {exc}".replace("\n", " ")) from None
    game_id, kind, architecture, files = raw["game_id"], raw["kind"], raw["architecture"], raw["files"]
    if game_id != game.id:
        raise SnapshotError(f"malformed manifest {where}: game_id {game_id!r} differs from game.id {game.id!r}")
    if not isinstance(kind, str) or not isinstance(architecture, dict):
        raise SnapshotError(f"malformed manifest {where}: kind must be a string and architecture an object")
    if not isinstance(files, dict) or not all(
            isinstance(n, str) and _FILE_NAME_RE.match(n) and n != MANIFEST_NAME
            and isinstance(h, str) and _SHA256_RE.match(h) for n, h in files.items()):
        raise SnapshotError(f"malformed manifest {where}: files must map plain file names to sha256 hex digests")
    return SnapshotManifest(version, game, game_id, kind, architecture, lineage, tuple(sorted(files.items())))


def read_manifest(path: str | os.PathLike) -> tuple[SnapshotManifest, bytes]:
    """The validated manifest of the snapshot at `path` and its bytes (no file hashes checked)."""
    directory = Path(path)
    if not directory.is_dir():
        raise SnapshotError(f"no snapshot directory at {directory}: give the path of a saved snapshot")
    data = _read_regular_file(directory / MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    return _parse_manifest(data, directory), data


def _check_files(directory: Path, manifest: SnapshotManifest, manifest_bytes: bytes,
                 keep: str | None = None) -> tuple[SnapshotRef, bytes | None]:
    """Re-hash every listed file; return the ref and the bytes of file `keep` (read once, so the
    bytes that are parsed are the bytes that were hashed)."""
    hashes = {MANIFEST_NAME: sha256_hex(manifest_bytes)}
    kept = None
    for name, expected in manifest.files:
        data = _read_regular_file(directory / name)
        digest = sha256_hex(data)
        if digest != expected:
            raise SnapshotError(f"hash mismatch for {directory / name}: the file is corrupt or was modified; "
                                f"re-copy the snapshot")
        hashes[name] = digest
        if name == keep:
            kept = data
    ref = SnapshotRef(directory, snapshot_id_of(hashes), manifest.game_id, manifest.lineage)
    return ref, kept


def verify_snapshot(path: str | os.PathLike) -> SnapshotRef:
    """Check the manifest and recompute every file hash; returns the snapshot's ref."""
    manifest, manifest_bytes = read_manifest(path)
    return _check_files(Path(path), manifest, manifest_bytes)[0]


def _architecture_mismatch(spec: GameSpec, config: NetConfig, shapes: Mapping[str, tuple[int, ...]]) -> str:
    """Why tensors of these shapes cannot be the weights of ActorCritic(spec, config); '' if they can.

    The net is built on the meta device (shapes only, no memory), so a hostile architecture record
    (say hidden=(10**9,)) costs nothing before the weights prove it."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in ActorCritic(spec, config).state_dict().items()}
    return shape_mismatch(expected, shapes)


def _read_kind(path: str | os.PathLike, expect_game: str | None,
               kind: str, parts: bool = False) -> tuple[Path, SnapshotManifest, bytes]:
    """The manifest of the snapshot at `path`, refused (one line) unless it plays `expect_game`
    (when given; with `parts`, a snapshot of a mix also plays each of its games: a text agent reads
    a game alone as it read it in the mix, games/mix.py), holds a `kind` model and lists that kind's
    weights file."""
    weights = snapshot_kind(kind).weights
    directory = Path(path)
    manifest, manifest_bytes = read_manifest(directory)
    if expect_game is not None and not (manifest.game_id == expect_game or parts and plays(manifest.game_id, expect_game)):
        raise SnapshotError(f"snapshot {directory} plays {manifest.game_id!r}, not {expect_game!r}: "
                            f"pick a snapshot of {expect_game!r}")
    if manifest.kind != kind:
        raise SnapshotError(f"snapshot {directory} holds a {manifest.kind!r} model, not a {kind!r} one")
    if expect_game is not None:
        # an adapter that changed what its ids read says why an older snapshot cannot play them
        problem = registry.snapshot_shape_problem(expect_game, tuple(manifest.game.observation_shape))
        if problem:
            raise SnapshotError(f"snapshot {directory} {problem}")
    if weights not in dict(manifest.files):
        raise SnapshotError(f"malformed manifest {directory / MANIFEST_NAME}: it lists no {weights}")
    return directory, manifest, manifest_bytes


def load_snapshot(path: str | os.PathLike, expect_game: str | None = None) -> LoadedSnapshot:
    """Verify the snapshot at `path` and rebuild its net (JSON + safetensors only, never pickle).

    `expect_game`: refuse a snapshot of any other game id.
    """
    directory, manifest, manifest_bytes = _read_kind(path, expect_game, KIND_ACTOR_CRITIC)
    ref, weights_bytes = _check_files(directory, manifest, manifest_bytes, keep=WEIGHTS_NAME)
    try:
        config = NetConfig.from_json(manifest.architecture)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"malformed manifest {directory / MANIFEST_NAME}: bad architecture: {exc}") from None

    from safetensors import SafetensorError
    from safetensors.torch import load as safetensors_load

    try:
        tensors = safetensors_load(weights_bytes)
    except (SafetensorError, ValueError, TypeError, RuntimeError) as exc:
        raise SnapshotError(f"corrupt weights file {directory / WEIGHTS_NAME}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    try:
        problem = _architecture_mismatch(manifest.game, config, {k: tuple(t.shape) for k, t in tensors.items()})
    except (ValueError, TypeError, RuntimeError) as exc:  # an architecture ActorCritic cannot build
        raise SnapshotError(f"malformed manifest {directory / MANIFEST_NAME}: bad architecture: {exc}") from None
    if problem:
        raise SnapshotError(f"weights in {directory / WEIGHTS_NAME} do not match the architecture: {problem}")
    if any(not (t.is_floating_point()) for t in tensors.values()):
        raise SnapshotError(f"weights in {directory / WEIGHTS_NAME} do not match the architecture: "
                            f"non-floating-point tensors")
    net = ActorCritic(manifest.game, config)
    net.load_state_dict(tensors, strict=True)
    net.eval()
    return LoadedSnapshot(ref, manifest, config, net)


def read_verified(path: str | os.PathLike, kind: str, expect_game: str | None = None,
                  parts: bool = False) -> tuple[SnapshotRef, SnapshotManifest, bytes]:
    """The ref, manifest and weights bytes of a snapshot of `kind` (every file re-hashed; the bytes
    returned are the bytes hashed): the start of a `SnapshotKind.policy` loader written outside.
    `parts`: a text agent's kind, whose snapshot of a mix plays each of its games (`_read_kind`)."""
    directory, manifest, manifest_bytes = _read_kind(path, expect_game, kind, parts)
    ref, data = _check_files(directory, manifest, manifest_bytes, keep=snapshot_kind(kind).weights)
    return ref, manifest, data


def read_verified_files(path: str | os.PathLike, kind: str,
                        expect_game: str | None = None) -> tuple[SnapshotRef, SnapshotManifest, dict[str, bytes]]:
    """The ref and manifest of a snapshot of `kind` and the bytes of every file its manifest lists
    (each re-hashed: the bytes returned are the bytes hashed), for a loader that reads them all (the
    "lm" kind's weights and tokenizer files)."""
    directory, manifest, manifest_bytes = _read_kind(path, expect_game, kind)
    hashes = {MANIFEST_NAME: sha256_hex(manifest_bytes)}
    contents: dict[str, bytes] = {}
    for name, expected in manifest.files:
        data = _read_regular_file(directory / name)
        if sha256_hex(data) != expected:
            raise SnapshotError(f"hash mismatch for {directory / name}: the file is corrupt or was modified; "
                                f"re-copy the snapshot")
        hashes[name] = expected
        contents[name] = data
    return SnapshotRef(directory, snapshot_id_of(hashes), manifest.game_id, manifest.lineage), manifest, contents


def policy_from_snapshot(path: str | os.PathLike, expect_game: str | None = None, lm_base: Any | None = None) -> Policy:
    """The Policy of any snapshot, by its manifest's kind (`SNAPSHOT_KINDS`): a TorchPolicy for
    "actor_critic", a `ludus.agents.lm.generation.LMPolicy` for "lm" (token games: it reads the game's
    token ids, padding id 0), a `ludus.agents.lm.text_policy.TextLMPolicy` for "lm_adapter"."""
    manifest, _ = read_manifest(path)
    return snapshot_kind(manifest.kind, path).policy(path, expect_game, lm_base)


def _actor_critic_policy(path: str | os.PathLike, expect_game: str | None, lm_base: Any | None) -> Policy:
    return TorchPolicy(load_snapshot(path, expect_game).net)


# --------------------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class SnapshotKind:
    """What a manifest's ``kind`` means: which file holds the weights and how they become a
    `Policy`. One record per kind in `SNAPSHOT_KINDS`, looked up by the stored name."""

    name: str
    """The manifest's ``kind`` value, as stored ("actor_critic"): never renamed, or stored
    snapshots stop loading."""
    weights: str
    """The file the manifest must list for this kind (its tensors, safetensors)."""
    policy: Callable[[str | os.PathLike, str | None, Any], Policy]
    """policy(path, expect_game, lm_base) -> the snapshot's Policy, verified (one-line
    SnapshotError for anything wrong); `lm_base` only matters to kinds on a pretrained base."""
    summary: str = ""
    """One line: what the weights are, for errors and docs."""


SNAPSHOT_KINDS: dict[str, SnapshotKind] = {}
"""The snapshot kinds by stored name. `register_snapshot_kind` adds one."""


def register_snapshot_kind(kind: SnapshotKind) -> None:
    """Add a snapshot kind at run time (a plugin's policy format, a test's toy); refuses a name taken."""
    if not isinstance(kind, SnapshotKind):
        raise SnapshotError(f"register_snapshot_kind takes a SnapshotKind, got {type(kind).__name__}")
    if kind.name in SNAPSHOT_KINDS or not _FILE_NAME_RE.match(kind.weights):
        raise SnapshotError(f"snapshot kind {kind.name!r} is already registered or its weights file "
                            f"{kind.weights!r} is no plain file name")
    SNAPSHOT_KINDS[kind.name] = kind


def snapshot_kind(name: str, path: str | os.PathLike | None = None) -> SnapshotKind:
    """The record of kind `name`; a one-line SnapshotError naming the known kinds."""
    if name not in SNAPSHOT_KINDS:
        what = f"snapshot {path} holds a {name!r} model" if path is not None else f"unknown snapshot kind {name!r}"
        raise SnapshotError(f"{what}: this Ludus loads the kinds {', '.join(SNAPSHOT_KINDS)}")
    return SNAPSHOT_KINDS[name]


for _kind in (
    SnapshotKind(KIND_ACTOR_CRITIC, WEIGHTS_NAME, _actor_critic_policy,
                 "a `ludus.agents.nets.ActorCritic`; the architecture is its NetConfig"),
    SnapshotKind(KIND_LM, WEIGHTS_NAME, Lazy("ludus.agents.lm.snapshots:lm_policy"),
                 "a causal language model with a value head playing token games (`save_lm_snapshot`)"),
    SnapshotKind(KIND_LM_ADAPTER, ADAPTER_WEIGHTS_NAME, Lazy("ludus.agents.lm.text_policy:text_policy_from_snapshot"),
                 "LoRA adapters and a value head on a pretrained base, playing text games (`save_adapter_snapshot`)"),
):
    register_snapshot_kind(_kind)
del _kind
