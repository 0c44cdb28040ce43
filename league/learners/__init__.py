"""Learners (`ludus.league.learners`): learners as the league sees them.

`base` holds the `LeagueLearner` seam and the policy architectures runners rebuild; `kinds` is the
table of learner kinds (one frozen `LearnerKind` a kind: settings, constructor, architecture,
validation; `register_learner_kind` adds one from outside); `learning` constructs a learner through
the table and holds the freezing rule; one module a kind (cfr, mappo, dialogue, text_lm; PPO's in
`base`); `ranks` runs data-parallel helper processes.

Adding a kind: its learner's module and one row in `kinds` (and, for a kind Ludus ships, a line in
`LeagueConfig.learner`'s docstring): nothing else names a kind (tests/test_learner_kinds.py).

Rule: import `ludus.agents`, `ludus.games`, the league's base (config, seeds, stats, checkpoint)
and `ludus.league.records`/`play`; never the manager, the arena or evaluation. `kinds` and what
its constructors import (base, cfr, mappo, dialogue, text_lm, ranks) never import the config,
which imports `kinds`.
"""
