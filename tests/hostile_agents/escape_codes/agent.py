"""Hostile: writes terminal control sequences (clear screen, cursor moves, a window title, an
8-bit CSI, a bell) to stderr, then plays an illegal move so the replay shows its stderr tail."""
import sys

sys.stderr.write("\x1b[2J\x1b[H\x1b]0;pwned\x07 all agents passed \x9b31m\r\x1b[1A forged line\n")
sys.stderr.flush()


def act(observation, legal_actions):
    return -1
