"""Ludus: a multi-agent self-play arena and league engine.

The work lives in the top-level packages `games`, `agents`, `league`, `arena` and
`evaluation`; this package holds the `ludus` command line (the top layer) and what every layer
shares (the error type, text escaping, charts).
"""

__version__ = "0.1.0"
