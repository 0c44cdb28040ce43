"""Records (`ludus.league.records`): a league's written history and the pure functions over it:
the ledger, ratings, payoff table, matchmaking, replay, population, and the recorder (their only writer).

Rule: import `ludus.agents`, `ludus.games` and the league's base (stats, checkpoint); the recorder
also reaches `ludus.league.play` and `ludus.league.learners` (the freezing rule); never the arena
or evaluation.
"""
