"""Hostile: allocates (and touches) memory until something stops it."""
import sys

hoard = []


def act(observation, legal_actions):
    while True:
        hoard.append(b"x" * (8 << 20))
        if len(hoard) % 16 == 0:
            print(f"MEMORY_BOMB holding {len(hoard) * 8} MiB", file=sys.stderr, flush=True)
