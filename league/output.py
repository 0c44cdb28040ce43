"""The league's output policy, written as a mixture checkpoint at every population change.

What a league "returns" depends on its recipe: for PSRO (a role with `meta_nash` weight) it is the
meta-strategy (the role's meta-solver's mixture: meta-Nash or PRD) over the whole frozen population (Lanctot et al. 2017: the meta-strategy, not
the last best response, is the approximate equilibrium); for every other recipe it is the main
agent, the newest snapshot of the first `main` role (AlphaStar's main agents are what it ships).
Either way ``<run>/output_policy/mixture.json`` (agents/mixture.py) names it, with paths into the
run's snapshots, so ``ludus evaluate``, ``ludus play``, ``ludus export`` and the arena take it
like any checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

from agents.mixture import OUTPUT_POLICY_DIR, Mixture, MixtureComponent, write_mixture
from games.core import GameSpec
from league.config import LeagueConfig
from league.population import Member, Population


def output_mixture(spec: GameSpec, config: LeagueConfig, population: Population, run_dir: Path,
                   iteration: int) -> Mixture | None:
    """The run's output policy now (None before the main role's first snapshot)."""
    psro_role = config.psro_role
    if psro_role is not None:
        from league.psro import MetaSolver, meta_game

        frozen = population.frozen()
        solver = MetaSolver.of(psro_role)
        strategy = meta_game(spec, frozen, run_dir, solver=solver).strategy
        support = [(member, float(weight)) for member, weight in zip(frozen, strategy) if weight > 0]
        source = (f"{'meta-Nash' if solver.kind == 'nash' else 'PRD meta-strategy'} of the exact PSRO meta-game "
                  f"over the frozen population")
    else:
        main = next((role for role in config.roles if role.kind == "main"), config.roles[0])
        snapshots = population.snapshots(main.name)
        if not snapshots:
            return None
        support = [(snapshots[-1], 1.0)]
        source = f"newest snapshot of role {main.name!r} (the main agent)"
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
