"""Hostile: tries to write the arena's database (path from LUDUS_ARENA_DB, and guesses), then plays.

Reports each attempt on stderr as 'WRITE <path>: wrote' or 'WRITE <path>: denied (...)'. Files of
the source tree are only opened for writing, never written: the probe must not harm a machine
it somehow runs on unsandboxed.
"""
import os
import sys
from pathlib import Path

import ludus.arena as arena


def attempt(path, write, create=False):
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        print(f"WRITE {path}: denied ({type(exc).__name__}: {exc.strerror})", file=sys.stderr, flush=True)
        return
    if write:
        os.write(fd, b"hostile was here")
    os.close(fd)
    if create and not write:
        os.unlink(path)
    print(f"WRITE {path}: wrote", file=sys.stderr, flush=True)


class Agent:
    def __init__(self):
        db = os.environ.get("LUDUS_ARENA_DB", "")
        repo = Path(arena.__file__).resolve().parent.parent
        if db:
            attempt(db, write=True)
            attempt(os.path.join(os.path.dirname(db), "hostile-new-file"), write=True, create=True)
        attempt(str(repo / "hostile-was-here"), write=False, create=True)
        attempt(str(repo / "arena" / "sandbox" / "process.py"), write=False)

    def act(self, observation, legal_actions):
        return legal_actions[0]
