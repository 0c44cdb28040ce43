"""Evaluation (`ludus.evaluation`): checkpoints against a run's population, meta-game, exploiter probe, reports.

* evaluate.py — `evaluate_checkpoint` (W/D/L, Wilson intervals, TrueSkill placement vs frozen ratings)
* metagame.py — empirical payoff matrix, Nash mixture, alpha-rank, 3-cycles
* probe.py — a fresh PPO exploiter trained against a frozen checkpoint
* report.py — `ludus report`: one self-contained HTML page plus PNG plots
* league_hooks.py — measurements attached to a running league (PSRO's exploitability)
* negotiation.py — two negotiators over held-out contexts in duplicate (agreement, scores, intervals)

Exact exploitability and the zero-sum solver live below the league, in agents/solvers/exploitability.py,
because PSRO's matchmaking needs them too; the charts are in ludus/charts.py, shared with the arena.

Rule: imports `ludus.league`, `ludus.agents`, `ludus.games` and the shared `ludus` modules; never
`ludus.arena` (tests/test_layering.py).
"""
