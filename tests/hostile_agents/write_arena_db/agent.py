"""Hostile: tries to write the arena's database (path from LUDUS_ARENA_DB, and guesses), then plays.

Reports each attempt on stderr as 'WRITE <path>: wrote' or 'WRITE <path>: denied (...)'.
"""
import os
import sys
from pathlib import Path

import arena


def attempt(path):
    try:
        with open(path, "ab") as f:
            f.write(b"hostile was here")
        print(f"WRITE {path}: wrote", file=sys.stderr, flush=True)
    except OSError as exc:
        print(f"WRITE {path}: denied ({type(exc).__name__}: {exc.strerror})", file=sys.stderr, flush=True)


class Agent:
    def __init__(self):
        db = os.environ.get("LUDUS_ARENA_DB", "")
        repo = Path(arena.__file__).resolve().parent.parent
        for path in [db, os.path.join(os.path.dirname(db), "hostile-new-file"),
                     str(repo / "hostile-was-here"), str(repo / "arena" / "sandbox.py")]:
            if path:
                attempt(path)

    def act(self, observation, legal_actions):
        return legal_actions[0]
