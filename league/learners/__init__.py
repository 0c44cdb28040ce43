"""Learners (`ludus.league.learners`): learners as the league sees them.

`base` holds the `LeagueLearner` seam and the policy architectures runners rebuild; `learning`
constructs a learner by kind and holds the freezing rule; one module a kind (cfr, mappo,
dialogue, text_lm); `ranks` runs data-parallel helper processes.

Rule: import `ludus.agents`, `ludus.games`, the league's base (config, seeds, stats, checkpoint)
and `ludus.league.records`/`play`; never the manager, the arena or evaluation.
"""
