"""League (`ludus.league`): populations trained by self-play, their matches, ratings and snapshots.

Rule: imports `ludus.agents`, `ludus.games` and the shared `ludus` modules; never the arena or
evaluation (tests/test_layering.py).

* the base: the API, the manager, the planner, config (schema and presets; phase B of issue 75
  makes it a package with presets as files), checkpoints, founders, metrics, seeds, stats, status,
  run data, PSRO, check, cli;
* `ludus.league.play`: where matches are played (the runner, the serial/process backends, Ray);
* `ludus.league.records`: what is written down (the ledger, ratings, payoff table, matchmaking's
  pure functions over them, replay, population, the recorder);
* `ludus.league.learners`: learners as the league sees them (the `LeagueLearner` seam in `base`,
  one module per kind, the table of learner kinds, `learning`'s constructor and freezing rule,
  data-parallel ranks).

The three sub-packages still import each other in places (the recorder asks `learning` for the
freezing rule; backends build learners' policies), but no import closes a circle
(tests/test_layering.py): the manager, not play/backends.py, picks the backend (`make_backend`),
since the Ray backend builds on that module.
"""
