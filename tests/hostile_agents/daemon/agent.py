"""Hostile: leaves a double-forked daemon (its own session, no parent) behind, then plays on."""
import os
import sys
import time


class Agent:
    def __init__(self):
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                while True:
                    time.sleep(1)
            os._exit(0)
        os.waitpid(child, 0)
        print("DAEMON started", file=sys.stderr, flush=True)

    def act(self, observation, legal_actions):
        return legal_actions[0]
