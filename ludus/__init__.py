"""Ludus: a multi-agent self-play arena and league engine.

The work lives in the top-level packages `games`, `agents`, `league`, `arena` and
`evaluation`; this package holds only the `ludus` command line and the shared error type.
"""

__version__ = "0.1.0"
