"""Hostile: writes 8 MiB to stderr on its first move, then plays honestly (stdout stays clean)."""
import sys


class Agent:
    def __init__(self):
        self.flooded = False

    def act(self, observation, legal_actions):
        if not self.flooded:
            self.flooded = True
            for i in range(8 * 1024):
                sys.stderr.write(f"{i:07d} " + "x" * 1015 + "\n")
            sys.stderr.write("FLOOD done\n")
            sys.stderr.flush()
        return legal_actions[0]
