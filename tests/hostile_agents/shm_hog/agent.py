"""Hostile: mmap(-1, 3 GiB) is a *shared* mapping; touched page by page it stays resident as
shared memory (not anonymous, not under RLIMIT_DATA) for as long as the agent lives."""
import mmap
import sys

SIZE = 3 << 30
region = mmap.mmap(-1, SIZE)


def act(observation, legal_actions):
    for offset in range(0, SIZE, 4096):
        region[offset] = 1
        if offset % (256 << 20) == 0:
            print(f"SHM_HOG holding {offset >> 20} MiB", file=sys.stderr, flush=True)
    print("SHM_HOG holds all 3 GiB", file=sys.stderr, flush=True)
    return legal_actions[0]
