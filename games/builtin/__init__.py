"""Built-in games (`ludus.games.builtin`): the games Ludus implements itself, batched in numpy.

Rule: import the base of `ludus.games` (core, registry, dialogue) and `ludus.errors`/`text`/
`bounds`; never `ludus.games.adapters`, never a higher family.
"""
