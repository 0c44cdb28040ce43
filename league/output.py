"""The league's output policy, written as a mixture checkpoint at every population change.

What a league "returns" depends on its recipe: for PSRO (a role with `meta_nash` weight) it is the
meta-strategy (the role's meta-solver's mixture: meta-Nash or PRD) over the whole frozen population (Lanctot et al. 2017: the meta-strategy, not
the last best response, is the approximate equilibrium); for every other recipe it is the main
agent, the newest snapshot of the first `main` role (AlphaStar's main agents are what it ships),
or with `output_policy: average` the linear average of all its snapshots (for games where
self-play cycles around an equilibrium that the average approaches), with `uniform_average` their
plain average (Single Deep CFR's iterates, league/learners/cfr.py).
Either way ``<run>/output_policy/mixture.json`` (agents/mixture.py) names it, with paths into the
run's snapshots, so ``ludus evaluate``, ``ludus play``, ``ludus export`` and the arena take it
like any checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ludus.agents.mixture import OUTPUT_POLICY_DIR, Mixture, MixtureComponent, write_mixture
from ludus.games.core import GameSpec
from ludus.league.config import LeagueConfig
from ludus.league.records.population import Member, Population


def output_support(spec: GameSpec, config: LeagueConfig, members: Sequence[Member],
                   run_dir: str | os.PathLike, save_cache: bool = True) -> tuple[list[tuple[Member, float]], str]:
    """The members of the output policy with their weights, and a line saying what it is (an
    empty support before the main role's first snapshot). `members`: the population's frozen
    members; `save_cache`: whether PSRO's meta-game may write new payoffs to the run's cache."""
    psro_role = config.psro_role
    if psro_role is not None:
        from ludus.league.psro import MetaSolver, meta_game

        solver = MetaSolver.of(psro_role)
        strategy = meta_game(spec, members, run_dir, save_cache, solver).strategy
        support = [(member, float(weight)) for member, weight in zip(members, strategy) if weight > 0]
        return support, (f"{'meta-Nash' if solver.kind == 'nash' else 'PRD meta-strategy'} of the exact PSRO "
                         f"meta-game over the frozen population")
    main = config.main_role
    snapshots = [m for m in members if m.kind == "snapshot" and m.role == main.name]
    if config.output_policy == "average":
        # Linear averaging: the k-th snapshot weighs k (CFR+'s average of its iterates, Tammelin
        # 2014): early snapshots are far from the equilibrium. On Leduc poker it beat the uniform
        # average of PPO self-play's snapshots in every run measured (docs/league.md).
        total = len(snapshots) * (len(snapshots) + 1) / 2
        return ([(member, (k + 1) / total) for k, member in enumerate(snapshots)],
                f"linear average of role {main.name!r}'s {len(snapshots)} snapshots (the k-th weighs k)")
    if config.output_policy == "uniform_average":
        # Single Deep CFR's iterates on Leduc poker: their plain average was 0.13-0.16
        # exploitable where the linear one was 0.17-0.23 (docs/league.md)
        return ([(member, 1.0 / len(snapshots)) for member in snapshots],
                f"uniform average of role {main.name!r}'s {len(snapshots)} snapshots")
    return [(member, 1.0) for member in snapshots[-1:]], f"newest snapshot of role {main.name!r} (the main agent)"


def output_mixture(spec: GameSpec, config: LeagueConfig, population: Population, run_dir: Path,
                   iteration: int) -> Mixture | None:
    """The run's output policy now (None before the main role's first snapshot)."""
    support, source = output_support(spec, config, population.frozen(), run_dir)
    if not support:
        return None
    components = tuple(_component(member, weight, Path(run_dir)) for member, weight in support)
    return Mixture(spec.id, components, source, iteration)


def _component(member: Member, weight: float, run_dir: Path) -> MixtureComponent:
    if member.kind == "anchor":
        return MixtureComponent(member.player_id, weight, bot=member.bot)
    # a run's member paths are relative to the run directory (or absolute); a mixture's paths are
    # relative to the mixture's own directory
    path = os.path.join(run_dir, member.snapshot_path)  # an absolute member path stays as it is
    relative = os.path.relpath(path, run_dir / OUTPUT_POLICY_DIR)
    return MixtureComponent(member.player_id, weight, snapshot=relative, snapshot_id=member.snapshot_id)


def write_output_policy(spec: GameSpec, config: LeagueConfig, population: Population, run_dir: Path,
                        iteration: int) -> Mixture | None:
    """Write ``<run>/output_policy/mixture.json`` (atomically); returns what was written."""
    mixture = output_mixture(spec, config, population, run_dir, iteration)
    if mixture is not None:
        write_mixture(run_dir / OUTPUT_POLICY_DIR, mixture)
    return mixture
