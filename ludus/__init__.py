"""Ludus: a multi-agent self-play arena and league engine.

Ludus installs one import name. The five families keep their folders at the repository root and
install as sub-packages of this one (pyproject.toml `package-dir`): `ludus.games` (games/),
`ludus.agents` (agents/), `ludus.league` (league/), `ludus.arena` (arena/) and `ludus.evaluation`
(evaluation/); nothing else is importable at top level, so a user's own `games` or `agents`
module never collides with ours. This folder holds the `ludus` command line (the top layer) and
what every layer shares (the error type, text escaping, bounds, files, charts, pages).

The arrows point one way: games <- agents <- league <- {arena, evaluation} <- ludus.cli. The shared
modules here import no family; only `ludus.cli` and `ludus.__main__` sit above everything
(tests/test_layering.py).
"""

__version__ = "0.1.0"
