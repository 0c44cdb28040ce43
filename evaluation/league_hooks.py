"""Measurements that evaluation attaches to a running league (`League.on_population_change`).

The league does not import evaluation; whoever starts a run (the `ludus` CLI, a benchmark) passes
`league_hooks(config)` in. Today that is exploitability: for a league on a small two-player
zero-sum OpenSpiel game whose output policy is a mixture (a PSRO role's meta-strategy, or the
average of the main role's snapshots, `output_policy: average` or `uniform_average`), when
snapshots join (each PSRO snapshot; every `AVERAGE_EVERY_SNAPSHOTS`-th snapshot of an average)
the exact exploitability of
the league's output policy and of the main role's newest snapshot is logged with the iteration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from ludus.agents.solvers.exploitability import exploitability
from ludus.games.core import GameSpec
from ludus.league.config import LeagueConfig
from ludus.league.output import output_support
from ludus.league.records.population import Member, with_absolute_paths
from ludus.league.psro import aggregate_members, member_table, payoff_cache

Hook = Callable[..., dict[str, float]]


AVERAGE_EVERY_SNAPSHOTS = 10
"""An average output policy is measured at every 10th snapshot of the main role: self-play
snapshots come every few seconds, and a measurement (the new snapshot's table, the aggregate and
two best responses) takes ~1 s on Leduc poker. PSRO's are measured at every snapshot."""


def league_hooks(config: LeagueConfig) -> list[Hook]:
    """The population-change hooks a run of `config` should carry."""
    if config.psro_role is not None:
        every = 1
    elif config.output_policy in ("average", "uniform_average") and exactly_measurable(config.game):
        every = AVERAGE_EVERY_SNAPSHOTS
    else:
        return []
    main = config.main_role.name

    def output_exploitability_hook(league) -> dict[str, float]:
        if len(league.population.snapshots(main)) % every:
            return {}
        return exploitability_metrics(league.spec, league.config, league.population.frozen(), league.run_dir)

    return [output_exploitability_hook]


def exactly_measurable(game_id: str) -> bool:
    """Whether `exploitability` can score policies of this game (small, two-player, zero-sum, OpenSpiel)."""
    from ludus.agents.solvers.exploitability import ExploitabilityError, two_player_zero_sum_game

    try:
        two_player_zero_sum_game(game_id)
    except ExploitabilityError:
        return False
    return True


def output_policy_table(spec: GameSpec, config: LeagueConfig, members: Sequence[Member],
                        run_dir: str | os.PathLike, save_cache: bool = True):
    """The output policy over `members` (frozen, paths relative to `run_dir`) as one OpenSpiel
    TabularPolicy: its members aggregated reach-weighted (`ludus.agents.solvers.exploitability.aggregate_mixture`)."""
    support, _ = output_support(spec, config, members, run_dir, save_cache)
    return aggregate_members(spec, support, run_dir)


def exploitability_metrics(spec: GameSpec, config: LeagueConfig, members: Sequence[Member],
                           run_dir: str | os.PathLike) -> dict[str, float]:
    """``eval/exploitability`` of the output policy over `members` and ``eval/main_exploitability``
    of the main role's newest snapshot. They change only when a snapshot joins."""
    metrics = {"eval/exploitability": exploitability(spec.id, output_policy_table(spec, config, members, run_dir))}
    main = config.main_role.name
    newest = next((m for m in reversed(members) if m.kind == "snapshot" and m.role == main), None)
    if newest is not None:
        table = member_table(spec, with_absolute_paths([newest], run_dir)[0], payoff_cache(spec.id, run_dir))
        metrics["eval/main_exploitability"] = exploitability(spec.id, table)
    return metrics


def output_exploitability(run_dir: str | os.PathLike) -> float:
    """Exploitability (NashConv / 2) of the output policy of a run's population at its latest
    checkpoint (read-only: safe while it trains)."""
    from ludus.league.config import config_from_dict
    from ludus.league.rundata import read_run
    from ludus.games.registry import spec as game_spec

    run = read_run(Path(run_dir).resolve())  # member paths come back absolute, not cwd-relative
    spec = game_spec(run.game_id)
    config = config_from_dict(run.config)
    return exploitability(spec.id, output_policy_table(spec, config, run.frozen(), run.run_dir, save_cache=False))
