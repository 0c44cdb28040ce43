"""Hostile: act() returns a legal action in a form that is not an integer, so that only a host
that coerces (``int(value)``) would make a move of it. kind.txt beside this file says which form:

    string          "4" for the legal action 4
    float           4.7: int() truncates it to the legal 4
    integral_float  4.0
    bool            True, which int() makes 1 (legal on the first move of tic-tac-toe)
    numpy           numpy.int64(4): an integer, the one form here the host must accept
"""
from pathlib import Path

import numpy as np

KINDS = {
    "string": lambda legal: str(legal[0]),
    "float": lambda legal: legal[0] + 0.7,
    "integral_float": lambda legal: float(legal[0]),
    "bool": lambda legal: True if 1 in legal else legal[0],
    "numpy": lambda legal: np.int64(legal[0]),
}


class Agent:
    def __init__(self):
        self.answer = KINDS[(Path(__file__).parent / "kind.txt").read_text().strip()]

    def act(self, observation, legal_actions):
        return self.answer(legal_actions)
