"""Unpacking uploaded archives without trusting them (arena/uploads.py): every hostile archive is
refused with one line, and nothing is ever written outside the destination."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from ludus.arena.submission import SubmissionError
from ludus.arena.uploads import UploadLimits, unpack_archive

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "examples" / "agents" / "random_python"


def _zip(path: Path, entries: list[tuple[str, bytes]], mode: int | None = None, compress=zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compress) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = compress
            if mode is not None:
                info.external_attr = mode << 16
            archive.writestr(info, data)
    return path


def _tar(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None, mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as archive:
        for info in members:
            payload = (data or {}).get(info.name)
            archive.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def place(tmp_path):
    """An upload area whose parent holds a sentinel: nothing may appear beside or above it."""
    (tmp_path / "outside").mkdir()
    return tmp_path


def test_a_zipped_agent_folder_unpacks_to_the_folder(place):
    archive = place / "agent.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for file in AGENT.iterdir():
            z.write(file, f"random_python/{file.name}")
    folder = unpack_archive(archive, place / "unpacked")
    assert folder == place / "unpacked" / "random_python"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in AGENT.iterdir())
    assert (folder / "agent.toml").read_bytes() == (AGENT / "agent.toml").read_bytes()
    assert stat.S_IMODE(os.stat(place / "unpacked").st_mode) == 0o700


def test_a_tar_with_an_executable_keeps_its_execute_bit(place):
    info = tarfile.TarInfo("bot/run.sh")
    info.size, info.mode = 10, 0o755
    manifest = tarfile.TarInfo("bot/agent.toml")
    manifest.size = 3
    archive = _tar(place / "a.tar.gz", [info, manifest], {"bot/run.sh": b"#!/bin/sh\n", "bot/agent.toml": b"x=1"})
    folder = unpack_archive(archive, place / "unpacked")
    assert os.access(folder / "run.sh", os.X_OK) and not os.access(folder / "agent.toml", os.X_OK)


@pytest.mark.parametrize("name", ["../evil.py", "a/../../evil.py", "/tmp/evil.py", "a\\..\\evil.py", ".."])
def test_path_traversal_is_refused(place, name):
    archive = _zip(place / "t.zip", [("agent.toml", b"x"), (name, b"boom")])
    with pytest.raises(SubmissionError, match="climbs out|absolute|backslash|names no file"):
        unpack_archive(archive, place / "unpacked")
    assert not (place / "unpacked").exists() and _tree(place) == {"outside", "t.zip"}
    assert not Path("/tmp/evil.py").exists()


def test_symlinks_and_links_are_refused_in_zip_and_tar(place):
    archive = _zip(place / "s.zip", [("link", b"../outside")], mode=stat.S_IFLNK | 0o777)
    with pytest.raises(SubmissionError, match="symlink"):
        unpack_archive(archive, place / "u1")
    link = tarfile.TarInfo("bot/link")
    link.type, link.linkname = tarfile.SYMTYPE, "../../outside"
    through = tarfile.TarInfo("bot/link/evil.py")
    through.size = 4
    with pytest.raises(SubmissionError, match="symlink"):
        unpack_archive(_tar(place / "s.tar.gz", [link, through], {"bot/link/evil.py": b"boom"}), place / "u2")
    hard = tarfile.TarInfo("bot/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    with pytest.raises(SubmissionError, match="hard link"):
        unpack_archive(_tar(place / "h.tar", [hard], mode="w"), place / "u3")
    fifo = tarfile.TarInfo("bot/pipe")
    fifo.type = tarfile.FIFOTYPE
    with pytest.raises(SubmissionError, match="FIFO"):
        unpack_archive(_tar(place / "f.tar", [fifo], mode="w"), place / "u4")
    assert not any((place / f"u{i}").exists() for i in range(1, 5))
    assert list((place / "outside").iterdir()) == []


def test_zip_bombs_are_refused_before_and_while_inflating(place):
    limits = UploadLimits(max_unpacked_bytes=8 << 20, max_ratio=100)
    # declares its size honestly: refused from the listing (inflates ~1000-fold)
    honest = _zip(place / "bomb.zip", [("agent.toml", b"x"), ("zeros", b"\0" * (16 << 20))])
    with pytest.raises(SubmissionError, match="zip bomb|more than"):
        unpack_archive(honest, place / "u1", limits)
    # lies about its size in the central directory: stopped while inflating
    liar = place / "liar.zip"
    _zip(liar, [("agent.toml", b"x"), ("zeros", b"\0" * (4 << 20))])
    data = bytearray(liar.read_bytes())
    central = data.rfind(b"PK\x01\x02")  # the last central-directory entry: 'zeros'
    data[central + 24:central + 28] = (1000).to_bytes(4, "little")  # uncompressed size: 1000 bytes
    liar.write_bytes(bytes(data))
    with pytest.raises(SubmissionError, match="zip bomb|damaged"):
        unpack_archive(liar, place / "u2", limits)
    # a gzip-compressed tar that inflates past the budget: refused from its headers
    big = tarfile.TarInfo("zeros")
    big.size = 64 << 20
    with pytest.raises(SubmissionError, match="more than|zip bomb"):
        unpack_archive(_tar(place / "b.tar.gz", [big], {"zeros": b"\0" * (64 << 20)}), place / "u3", limits)
    assert not any((place / f"u{i}").exists() for i in range(1, 4))


def test_ten_thousand_files_are_refused(place):
    archive = place / "many.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for i in range(10_000):
            z.writestr(f"f{i}", b"")
    with pytest.raises(SubmissionError, match="10000 members, more than 2000"):
        unpack_archive(archive, place / "unpacked")
    assert not (place / "unpacked").exists()
    members = [tarfile.TarInfo(f"f{i}") for i in range(10_000)]
    with pytest.raises(SubmissionError, match="more than 2000 members"):
        unpack_archive(_tar(place / "many.tar", members, mode="w"), place / "unpacked")


def test_duplicates_oversize_and_garbage_are_refused(place):
    with pytest.raises(SubmissionError, match="twice"):
        unpack_archive(_zip(place / "d.zip", [("a", b"1"), ("./a", b"2")]), place / "u1")
    with pytest.raises(SubmissionError, match="MiB, more than"):
        unpack_archive(_zip(place / "o.zip", [("a", os.urandom(2 << 20))]), place / "u2",
                       UploadLimits(max_upload_bytes=1 << 20))
    (place / "g.bin").write_bytes(b"this is not an archive")
    with pytest.raises(SubmissionError, match="neither a zip nor a tar"):
        unpack_archive(place / "g.bin", place / "u3")
    assert not any((place / f"u{i}").exists() for i in range(1, 4))
