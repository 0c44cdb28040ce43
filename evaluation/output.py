"""Exploitability of a whole run: its output policy, its newest snapshot and its best one.

A PSRO run's answer is its output policy (the meta-Nash mixture, league/output.py), not its last
best response, and the two can differ a lot (Lanctot et al. 2017, Fig. 2; a Leduc run measured
1.156 for the mixture, 1.554 for the newest snapshot and 0.931 for the best). `ludus evaluate RUN
--exploitability` prints all three, so no figure is reachable only from Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ludus.agents.solvers.exploitability import ExploitabilityResult, exploitability_of
from ludus.agents.mixture import OUTPUT_POLICY_DIR, is_mixture
from ludus.league.rundata import read_run


@dataclass(frozen=True)
class RunExploitability:
    """One measured policy of a run."""

    label: str
    """``output policy``, ``newest snapshot`` or ``best snapshot``."""
    policy: str
    """What was measured: a player id, or the output policy's directory."""
    result: ExploitabilityResult

    def to_json(self) -> dict:
        return {"label": self.label, "policy": self.policy, **self.result.to_json()}


def run_exploitability(run_dir: str | os.PathLike) -> list[RunExploitability]:
    """Exact exploitability of the run's output policy, newest snapshot and best snapshot (each
    present one; every snapshot is measured to find the best). The run is only read."""
    run = read_run(run_dir)
    rows: list[RunExploitability] = []
    output = Path(run.run_dir) / OUTPUT_POLICY_DIR
    if is_mixture(output):
        rows.append(RunExploitability("output policy", str(output), exploitability_of(output)))
    snapshots = [m for m in run.members if m.kind == "snapshot"]
    if snapshots:
        measured = [(m, exploitability_of(m.snapshot_path)) for m in snapshots]
        newest, newest_result = measured[-1]
        best, best_result = min(measured, key=lambda pair: pair[1].nash_conv)
        rows.append(RunExploitability("newest snapshot", newest.player_id, newest_result))
        rows.append(RunExploitability("best snapshot", best.player_id, best_result))
    return rows


def format_run_exploitability(rows: list[RunExploitability]) -> str:
    if not rows:
        return "no snapshot yet: nothing to measure"
    lines = [f"{rows[0].result.game_id}: exploitability (NashConv / players)"]
    for row in rows:
        value = row.result.exploitability if row.result.exploitability is not None else row.result.nash_conv
        lines.append(f"  {row.label:<16} {value:.6f}  {row.policy}")
    return "\n".join(lines)
