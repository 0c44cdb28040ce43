"""A game registered in Python with `ludus.games.registry.register` (not an entry point): tic-tac-toe
under the id `renamed_ttt`, whose parameter `label` is left out of the spec id at its default (as
negotiation's are), so `renamed_ttt(label=a)` and `renamed_ttt` name one game. Importing this
module registers it (tests/test_newcomer.py puts this folder on PYTHONPATH)."""

from __future__ import annotations

import dataclasses

from ludus.games.builtin.native import make_tic_tac_toe
from ludus.games.registry import register


class RenamedTicTacToe:
    """Tic-tac-toe under another id; every other attribute is the built-in game's."""

    def __init__(self, label: str = "a"):
        self.inner = make_tic_tac_toe()
        game_id = "renamed_ttt" if label == "a" else f"renamed_ttt(label={label})"
        self.spec = dataclasses.replace(self.inner.spec, id=game_id, spiel_name=None)

    def __getattr__(self, name):
        return getattr(self.inner, name)


register("renamed_ttt", RenamedTicTacToe, summary="tic-tac-toe registered in Python (tests)")
