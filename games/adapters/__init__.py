"""Game adapters (`ludus.games.adapters`): games of other libraries behind Ludus's game protocol.

Rule: import the base of `ludus.games` (core, registry) and `ludus.errors`/`text`/`bounds`; never
`ludus.games.builtin`, never a higher family.
"""
