"""Play (`ludus.league.play`): where a league's matches are played: the runner, its backends, Ray.

Rule: import `ludus.agents`, `ludus.games`, `ludus.league.records` and the learners' policy
architectures (`ludus.league.learners.base`); never the manager or above.
"""
