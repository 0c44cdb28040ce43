"""Bots (`ludus.agents.bots`): fixed opponents that anchor ratings, and scripted policies.

`builtin` holds the bots `make_bot` knows by name (random, MCTS, perfect tic-tac-toe, scripted);
connect four's compiled MCTS, MPE's scripted policies and the scripted negotiators sit beside it.

Rule: import the base of `ludus.agents` (policy) and `ludus.games` (the built-in games the scripted
bots read); never `ludus.agents.rl`, `solvers` or `lm`, never the league or above.
"""
