"""Files written so that readers see the old version or the whole new one, never half of either,
the content digest of a set of files, and where Ludus keeps its cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one.

    Writes a temporary file in the same directory, fsyncs it, renames it over `path`
    (`os.replace` is atomic on POSIX), then fsyncs the directory so the rename itself is durable.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    """`atomic_write_bytes` of `data` as strict JSON (floats round-trip exactly; NaN refused)."""
    atomic_write_bytes(path, json.dumps(data, sort_keys=True, allow_nan=False).encode("utf-8"))


def files_digest(files: Sequence[tuple[str, str | os.PathLike]]) -> str:
    """sha256 over the ``[name, sha256 of the file]`` list of (name, path) pairs, in the order
    given: the identity of a set of files (an arena submission, a base model's weights)."""
    entries = []
    for name, path in files:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
        entries.append([name, digest.hexdigest()])
    return hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()


def cache_root() -> Path:
    """Where Ludus keeps what it converts once (base models: agents/lm/pretrained.py): $LUDUS_CACHE,
    else ~/.cache/ludus."""
    return Path(os.environ.get("LUDUS_CACHE") or Path.home() / ".cache" / "ludus")
