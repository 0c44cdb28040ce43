"""Hostile: takes LUDUS_STALL_S seconds to start (just under the start limit), plays its first match
cleanly, then stalls past the move limit in its second, so it is restarted, slowly, for the next.
A fault count that one clean match resets never declares it dead; each cycle costs the tournament
a slow start and a timeout."""
import os
import sys
import time

time.sleep(float(os.environ.get("LUDUS_STALL_S", "29")))
print("STALLER started", file=sys.stderr, flush=True)


class Agent:
    def __init__(self):
        self.matches = 0

    def start(self, seat, seed):
        self.matches += 1

    def act(self, observation, legal_actions):
        if self.matches >= 2:
            time.sleep(3600)
        return legal_actions[0]
