"""Hostile: tries to read other agents' files (paths from LUDUS_PROBE_READ, ':'-separated), then plays.

Reports each attempt on stderr as 'READ <path>: read N bytes' or 'READ <path>: denied (...)'.
"""
import os
import sys


class Agent:
    def __init__(self):
        for path in filter(None, os.environ.get("LUDUS_PROBE_READ", "").split(":")):
            try:
                if os.path.isdir(path):
                    names = os.listdir(path)
                    print(f"READ {path}: listed {names}", file=sys.stderr, flush=True)
                    continue
                with open(path, "rb") as f:
                    data = f.read()
                print(f"READ {path}: read {len(data)} bytes", file=sys.stderr, flush=True)
            except OSError as exc:
                print(f"READ {path}: denied ({type(exc).__name__}: {exc.strerror})", file=sys.stderr, flush=True)

    def act(self, observation, legal_actions):
        return legal_actions[0]
