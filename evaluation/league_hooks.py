"""Measurements that evaluation attaches to a running league (`League.on_population_change`).

The league does not import evaluation; whoever starts a run (the `ludus` CLI, a benchmark) passes
`league_hooks(config)` in. Today that is PSRO's exploitability: for a league with a `meta_nash`
role on a small two-player zero-sum OpenSpiel game, every time snapshots join, the exact
exploitability of the league's output policy (the meta-Nash mixture, league/psro.py) and of the
role's newest snapshot (its last best response) is logged with the iteration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from agents.exploitability import exploitability
from games.core import GameSpec
from league.config import LeagueConfig
from league.population import Member, with_absolute_paths
from league.psro import MetaSolver, league_output_policy, member_table, payoff_cache

Hook = Callable[..., dict[str, float]]


def league_hooks(config: LeagueConfig) -> list[Hook]:
    """The population-change hooks a run of `config` should carry."""
    psro_role = config.psro_role
    if psro_role is None:
        return []

    def psro_exploitability(league) -> dict[str, float]:
        return exploitability_metrics(league.spec, league.population.frozen(), league.run_dir, role=psro_role.name,
                                      solver=MetaSolver.of(psro_role))

    return [psro_exploitability]


def exploitability_metrics(spec: GameSpec, members: Sequence[Member], run_dir: str | os.PathLike,
                           role: str = "main", solver: MetaSolver = MetaSolver()) -> dict[str, float]:
    """``eval/exploitability`` of the output policy (the `solver`'s meta-strategy over `members`)
    and ``eval/main_exploitability`` of `role`'s newest snapshot. They change only when a snapshot joins."""
    policy = league_output_policy(spec, members, run_dir, solver=solver)
    metrics = {"eval/exploitability": exploitability(spec.id, policy)}
    newest = next((m for m in reversed(members) if m.kind == "snapshot" and m.role == role), None)
    if newest is not None:
        table = member_table(spec, with_absolute_paths([newest], run_dir)[0], payoff_cache(spec.id, run_dir))
        metrics["eval/main_exploitability"] = exploitability(spec.id, table)
    return metrics


def output_exploitability(run_dir: str | os.PathLike) -> float:
    """Exploitability (NashConv / 2) of the output policy of a run's population at its latest
    checkpoint: its PSRO role's meta-strategy over all its frozen members (read-only: safe while it trains)."""
    from league.config import config_from_dict
    from league.rundata import read_run
    from games.registry import spec as game_spec

    run = read_run(Path(run_dir).resolve())  # member paths come back absolute, not cwd-relative
    spec = game_spec(run.game_id)
    psro_role = config_from_dict(run.config).psro_role
    solver = MetaSolver.of(psro_role) if psro_role is not None else MetaSolver()
    return exploitability(spec.id, league_output_policy(spec, run.frozen(), run.run_dir, save_cache=False,
                                                        solver=solver))
