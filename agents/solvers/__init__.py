"""Game solvers (`ludus.agents.solvers`): Deep CFR, MMD and exact exploitability.

Rule: import the base of `ludus.agents` and `ludus.games` (OpenSpiel's adapter for the exact
computations); never `ludus.agents.lm`, `rl` or `bots`, never the league or above.
"""
