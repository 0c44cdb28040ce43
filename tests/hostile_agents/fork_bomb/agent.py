"""Hostile: on its first move forks until the kernel refuses (children sleep), then plays on.

Reports 'FORK_BOMB stopped after N forks: <error>' on stderr.
"""
import os
import signal
import sys


class Agent:
    def __init__(self):
        self.bombed = False

    def act(self, observation, legal_actions):
        if not self.bombed:
            self.bombed = True
            forks = 0
            while True:
                try:
                    pid = os.fork()
                except OSError as exc:
                    print(f"FORK_BOMB stopped after {forks} forks: {type(exc).__name__}", file=sys.stderr, flush=True)
                    break
                if pid == 0:
                    while True:
                        signal.pause()
                forks += 1
        return legal_actions[0]
