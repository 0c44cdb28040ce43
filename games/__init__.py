"""Games (`ludus.games`): a game's facts as values, its batched environment, the registry that builds one by id.

Rule: the bottom family. It imports nothing of Ludus but `ludus.errors`, `ludus.text` and
`ludus.bounds` (tests/test_layering.py).

* the base (core, registry, check, text, dialogue, cli): the game protocol, the registry, the
  conformance checker, text views;
* `ludus.games.adapters`: other libraries' games (OpenSpiel, PettingZoo, Gymnasium, TextArena, AEC);
* `ludus.games.builtin`: the games Ludus implements itself (native board games, negotiation,
  signalling, simple_tag, teams).

Adapters and built-in games import the base and never each other. The base reaches them by
module path ("ludus.games.builtin.native:CONNECT_FOUR_ENTRY") or by a lazy import in the
registry, the text views and the CLI (issue 75 phase B turns that into one table of adapters).
"""
