"""Hostile: forks 16 children that spin forever, then plays legal moves as if nothing happened.

Each child starts a session of its own, so the kernel's per-session scheduling groups (autogroup)
give each spinner the weight of a whole session: only a quota on the agent's tree contains them."""
import os
import sys

for _ in range(16):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
print("CPU_HOG 16 children spinning", file=sys.stderr, flush=True)


def act(observation, legal_actions):
    return legal_actions[0]
