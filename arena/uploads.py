"""Unpacking an uploaded submission archive (zip or tar, optionally gzip/bz2/xz) without trusting it.

An archive from a stranger may try to write outside the folder it is unpacked into (absolute
names, ``..``, symlinks or hard links that point out, then a file written through them), to
exhaust the disk or the inode table (a zip bomb: a few kilobytes that inflate to gigabytes; ten
thousand tiny files), or to plant devices and FIFOs. `unpack_archive` reads the member list
first and refuses, with one line naming the problem, any archive that

* has a member whose name is absolute, contains ``..``, a backslash or a NUL, or is not UTF-8;
* has a member that is not a regular file or a directory (symlinks, hard links, devices, FIFOs);
* has more than `UploadLimits.max_files` members, or names one path twice;
* declares more than `UploadLimits.max_unpacked_bytes` in total, or a compression ratio above
  `UploadLimits.max_ratio` (a member that inflates more than that is a bomb, whatever it claims);

then writes each member itself (never `extractall`), counting the bytes it actually inflates and
stopping at the same limits, into a fresh directory it creates with mode 0700. Files are created
with ``O_CREAT | O_EXCL | O_NOFOLLOW`` below directories this function made, so nothing is ever
written outside `destination`. On any refusal the half-written directory is removed.

The upload itself (its byte count) is capped by the service before it gets here
(`UploadLimits.max_upload_bytes`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

from ludus.arena.submission import SubmissionError

_CHUNK = 1 << 16


@dataclass(frozen=True)
class UploadLimits:
    """What one uploaded archive may be."""

    max_upload_bytes: int = 64 << 20
    """The archive itself (64 MiB)."""
    max_unpacked_bytes: int = 256 << 20
    """All its files together once unpacked (256 MiB)."""
    max_files: int = 2000
    """Members (files and directories)."""
    max_ratio: float = 200.0
    """Unpacked bytes per archived byte, per member and in total: above it, a zip bomb."""


@dataclass(frozen=True)
class _Member:
    name: str
    is_dir: bool
    size: int
    """Declared unpacked size."""
    packed: int
    """Bytes it takes in the archive (zip: compressed size; tar: its size)."""
    executable: bool


def _fail(message: str) -> None:
    raise SubmissionError(message)


def _safe_parts(name: str) -> tuple[str, ...]:
    """The path components of a member name, or a refusal."""
    if not name or "\x00" in name or "\\" in name:
        _fail(f"archive member {name!r} has an empty name, a NUL or a backslash; use plain relative paths")
    path = PurePosixPath(name)
    if path.is_absolute():
        _fail(f"archive member {name!r} is an absolute path; archive the folder's contents with relative paths")
    parts = tuple(p for p in path.parts if p not in ("", "."))
    if any(p == ".." for p in parts):
        _fail(f"archive member {name!r} climbs out of the folder ('..'); archive only the folder's own files")
    if not parts:
        _fail(f"archive member {name!r} names no file")
    return parts


def _zip_members(archive: zipfile.ZipFile) -> list[_Member]:
    members = []
    for info in archive.infolist():
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if info.is_dir():
            members.append(_Member(info.filename, True, 0, 0, False))
            continue
        if kind not in (0, stat.S_IFREG):  # 0: made on a system that records no Unix mode
            what = "a symlink" if kind == stat.S_IFLNK else "not a regular file"
            _fail(f"archive member {info.filename!r} is {what}; archives may hold only files and directories")
        if info.flag_bits & 0x1:
            _fail(f"archive member {info.filename!r} is encrypted; upload an unencrypted archive")
        members.append(_Member(info.filename, False, info.file_size, info.compress_size, bool(mode & 0o111)))
    return members


def _tar_members(archive: tarfile.TarFile) -> Iterator[tuple[_Member, tarfile.TarInfo]]:
    for info in archive:  # streams: the member list is read as it goes, bounded by max_files below
        if info.isdir():
            yield _Member(info.name, True, 0, 0, False), info
        elif info.isreg():
            yield _Member(info.name, False, info.size, info.size, bool(info.mode & 0o111)), info
        else:
            what = ("a symlink" if info.issym() else "a hard link" if info.islnk() else
                    "a FIFO" if info.isfifo() else "a device" if info.isdev() else "not a regular file")
            _fail(f"archive member {info.name!r} is {what}; archives may hold only files and directories")


def _check_listing(members: list[_Member], archive_bytes: int, limits: UploadLimits) -> None:
    if len(members) > limits.max_files:
        _fail(f"the archive has {len(members)} members, more than {limits.max_files}; submit fewer files")
    seen: set[tuple[str, ...]] = set()
    for m in members:
        parts = _safe_parts(m.name)
        if parts in seen and not m.is_dir:
            _fail(f"archive member {m.name!r} appears twice; archive each file once")
        seen.add(parts)
        if m.size > limits.max_ratio * max(m.packed, 1) + _CHUNK:
            _fail(f"archive member {m.name!r} inflates {m.size / max(m.packed, 1):.0f}-fold (a zip bomb?); "
                  f"the limit is {limits.max_ratio:.0f}")
    declared = sum(m.size for m in members)
    if declared > limits.max_unpacked_bytes:
        _fail(f"the archive unpacks to {declared >> 20} MiB, more than {limits.max_unpacked_bytes >> 20} MiB")
    if declared > limits.max_ratio * max(archive_bytes, 1) + _CHUNK:
        _fail(f"the archive inflates {declared / max(archive_bytes, 1):.0f}-fold (a zip bomb?); the limit is "
              f"{limits.max_ratio:.0f}")


class _Writer:
    """Creates directories and files strictly below one root, counting what it writes."""

    def __init__(self, root: Path, limits: UploadLimits, archive_bytes: int):
        self.root = root
        self.limits = limits
        self.budget = min(limits.max_unpacked_bytes, int(limits.max_ratio * max(archive_bytes, 1)) + _CHUNK)
        self.written = 0
        self.made: set[tuple[str, ...]] = set()

    def directory(self, parts: tuple[str, ...]) -> Path:
        path = self.root
        for i, part in enumerate(parts):
            path = path / part
            if parts[:i + 1] in self.made:
                continue
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode):
                    _fail(f"archive member {'/'.join(parts[:i + 1])!r} is both a file and a directory")
            self.made.add(parts[:i + 1])
        return path

    def file(self, parts: tuple[str, ...], source: BinaryIO, declared: int, executable: bool) -> None:
        parent = self.directory(parts[:-1])
        path = parent / parts[-1]
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700 if executable else 0o600)
        except FileExistsError:
            _fail(f"archive member {'/'.join(parts)!r} appears twice; archive each file once")
        with os.fdopen(fd, "wb") as out:
            size = 0
            while chunk := source.read(_CHUNK):
                size += len(chunk)
                self.written += len(chunk)
                if size > declared or self.written > self.budget:
                    _fail(f"archive member {'/'.join(parts)!r} inflates past what the archive declares or past "
                          f"{self.budget >> 20} MiB (a zip bomb?)")
                out.write(chunk)


def unpack_archive(archive_path: str | os.PathLike, destination: str | os.PathLike,
                   limits: UploadLimits = UploadLimits()) -> Path:
    """Unpack a zip or tar archive into `destination` (created here; it must not exist) and return
    the submission folder: `destination` itself, or its only top-level directory when the archive
    wraps everything in one (``bot/agent.toml``). Raises `SubmissionError` with one line."""
    archive_path = Path(archive_path)
    root = Path(destination)
    archive_bytes = archive_path.stat().st_size
    if archive_bytes > limits.max_upload_bytes:
        _fail(f"the archive is {archive_bytes >> 20} MiB, more than {limits.max_upload_bytes >> 20} MiB")
    os.mkdir(root, 0o700)
    try:
        writer = _Writer(root, limits, archive_bytes)
        if zipfile.is_zipfile(archive_path):
            with zipfile.ZipFile(archive_path) as archive:
                members = _zip_members(archive)
                _check_listing(members, archive_bytes, limits)
                for member, info in zip(members, archive.infolist()):
                    parts = _safe_parts(member.name)
                    if member.is_dir:
                        writer.directory(parts)
                    else:
                        with archive.open(info) as source:
                            writer.file(parts, source, member.size, member.executable)
        else:
            try:
                archive = tarfile.open(archive_path, mode="r:*")
            except (tarfile.TarError, EOFError, OSError) as exc:
                _fail(f"the upload is neither a zip nor a tar archive ({exc}); upload a .zip, .tar or .tar.gz")
            with archive:
                listed: list[tuple[_Member, tarfile.TarInfo]] = []
                declared = 0
                for item in _tar_members(archive):
                    # Listing a compressed tar inflates it (headers sit between the data): stop
                    # as soon as what it declares passes the budget, before inflating more.
                    listed.append(item)
                    declared += item[0].size
                    if len(listed) > limits.max_files:
                        _fail(f"the archive has more than {limits.max_files} members; submit fewer files")
                    if declared > writer.budget:
                        _fail(f"the archive unpacks to more than {writer.budget >> 20} MiB (the limit for an "
                              f"archive of {archive_bytes >> 10} KiB); submit fewer or smaller files")
                _check_listing([m for m, _ in listed], archive_bytes, limits)
                for member, info in listed:
                    parts = _safe_parts(member.name)
                    if member.is_dir:
                        writer.directory(parts)
                    else:
                        source = archive.extractfile(info)
                        if source is None:
                            _fail(f"archive member {member.name!r} cannot be read")
                        with source:
                            writer.file(parts, source, member.size, member.executable)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise SubmissionError(f"the archive is damaged ({type(exc).__name__}: {exc}); upload it again") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    entries = os.listdir(root)
    if len(entries) == 1 and (root / entries[0]).is_dir():  # only this function made anything in root
        return root / entries[0]
    return root
