"""Evaluation: checkpoints against a run's population, exploitability, meta-game, exploiter probe, reports.

* evaluate.py — `evaluate_checkpoint` (W/D/L, Wilson intervals, TrueSkill placement vs frozen ratings)
* exploitability.py — `SpielPolicyAdapter`, `exploitability`, `nash_conv`, `aggregate_mixture`
* metagame.py — empirical payoff matrix, Nash mixture, alpha-rank, 3-cycles
* probe.py — a fresh PPO exploiter trained against a frozen checkpoint
* report.py — `ludus report`: one self-contained HTML page plus PNG plots
* charts.py — dependency-free SVG charts (PNG via matplotlib), shared with the arena's leaderboard
"""
