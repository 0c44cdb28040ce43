"""Games (`ludus.games`): a game's facts as values, its batched environment, the registry that builds one by id.

Rule: the bottom family. It imports nothing of Ludus but `ludus.errors`, `ludus.text` and
`ludus.bounds` (tests/test_layering.py).

* the base (core, registry, check, text, dialogue, cli): the game protocol, the registry, the
  conformance checker, text views;
* `ludus.games.adapters`: other libraries' games (OpenSpiel, PettingZoo, Gymnasium, TextArena, AEC);
* `ludus.games.builtin`: the games Ludus implements itself (native board games, negotiation,
  signalling, simple_tag, teams).

Adapters and built-in games import the base and never each other. The base reaches them by
module path only: built-in games by entry point ("ludus.games.builtin.native:CONNECT_FOUR_ENTRY"),
adapters through the one table of `GameAdapter` records in `ludus.games.registry.ADAPTERS`, whose
hooks ("ludus.games.adapters.spiel:make_spiel_game") are imported on first call; the text views
and the CLI ask the record, never the prefix.
"""
