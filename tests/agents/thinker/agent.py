"""Honest, and CPU-bound: spends 0.15 s (LUDUS_THINK_CPU_S) of its own CPU time on every move, then plays the first
legal action. Starved of CPU (no quota on a neighbour's spinning children) it misses its move time."""
import os
import time

THINK_CPU_S = float(os.environ.get("LUDUS_THINK_CPU_S", "0.15"))


def act(observation, legal_actions):
    start = time.process_time()
    while time.process_time() - start < THINK_CPU_S:
        pass
    return legal_actions[0]
