"""Tic-tac-toe skill: does `ludus train tic_tac_toe` learn perfect play within its budget?

Trains the `tic_tac_toe` preset (as `ludus train tic_tac_toe --set seed=S` does, logging off),
times it, then plays the main agent GREEDILY against the perfect player in every line of play
(evaluation/perfect_play.py: every optimal reply of the perfect player enumerated, the agent in
both seats). The figure is the number of lost lines of the learner's final weights; the newest
snapshot of 'main' is reported beside it. Also printed: wall-clock training seconds, env steps
(the machine-independent budget), the process's CPU seconds and the load average. The preset
trains on the serial backend (one process, one torch thread), so its CPU seconds are about the
wall time on an idle machine; on a shared machine the wall clock is inflated by the load.
The budget: 2 minutes of training on a quiet 2-core machine.

    python benchmarks/ttt_skill.py [--seed 0] [--set key=value ...] [--trace]

--trace evaluates the learner after every iteration (outside the timed training) and prints the
first iteration and env step count from which it never lost a line again.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

GOAL_LOSSES = 0
TIME_BUDGET_S = 120.0


@dataclass(frozen=True)
class SkillRun:
    """One seeded training run and its perfect-play evaluation."""

    seed: int
    train_seconds: float
    """Wall time of League.run(), without the per-iteration traces."""
    train_cpu_seconds: float
    """CPU time of this process during League.run() (traces excluded): with the serial backend
    and one torch thread, about the wall time the training takes on an idle machine."""
    env_steps: int
    iterations: int
    learner_losses: int
    learner_lines: int
    snapshot_id: str
    snapshot_losses: int
    snapshot_lines: int
    report_text: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    trace: tuple[tuple[int, int, int], ...]
    """(iteration, env steps so far, learner's lost lines) after each iteration (with --trace)."""

    @property
    def steps_per_second(self) -> float:
        return self.env_steps / max(self.train_seconds, 1e-9)

    def perfect_since(self) -> tuple[int, int] | None:
        """(iteration, env steps) from which every traced evaluation lost 0 lines."""
        since = None
        for iteration, steps, losses in self.trace:
            if losses == 0 and since is None:
                since = (iteration, steps)
            elif losses:
                since = None
        return since


def train_and_evaluate(seed: int, overrides: list[str] = (), trace: bool = False,
                       run_dir: str | os.PathLike | None = None) -> SkillRun:
    """Train the `tic_tac_toe` preset with `seed` (plus overrides) and evaluate it against perfect play."""
    from ludus.agents.snapshot import load_snapshot
    from ludus.agents.torch_policy import TorchPolicy
    from ludus.evaluation.perfect_play import format_perfect_play, losses_against_perfect
    from ludus.league.api import League, load_config

    config = load_config("tic_tac_toe", [f"seed={seed}", "log.wandb=disabled", "log.tensorboard=false",
                                         "log.progress=false", *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        league = League.create(config, Path(run_dir) if run_dir else Path(tmp) / "run")
        spec = league.spec
        traced: list[tuple[int, int, int]] = []
        tracing_seconds = [0.0, 0.0]  # wall, CPU
        if trace:
            def on_iteration(summary) -> None:
                start, start_cpu = time.perf_counter(), time.process_time()
                policy = TorchPolicy(league.learners["main"].impl.module)
                traced.append((summary.iteration, league.total_env_steps,
                               losses_against_perfect(policy, spec).losses))
                print(f"  after iteration {traced[-1][0]:3d} ({traced[-1][1]:>9,} env steps): "
                      f"{traced[-1][2]} lost lines", flush=True)
                tracing_seconds[0] += time.perf_counter() - start
                tracing_seconds[1] += time.process_time() - start_cpu

            league.on_iteration.append(on_iteration)
        load_before = os.getloadavg()
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            league.run()
            train_seconds = time.perf_counter() - start - tracing_seconds[0]
            train_cpu_seconds = time.process_time() - start_cpu - tracing_seconds[1]
            load_after = os.getloadavg()
            learner = league.learners["main"]
            final = losses_against_perfect(TorchPolicy(learner.impl.module), spec)
            newest = league.population[learner.last_snapshot]
            snapshot_path = Path(newest.snapshot_path)
            if not snapshot_path.is_absolute():
                snapshot_path = league.run_dir / snapshot_path
            loaded = load_snapshot(snapshot_path, expect_game=spec.id)
            newest_report = losses_against_perfect(TorchPolicy(loaded.net), spec)
            env_steps, iterations = league.total_env_steps, league.iteration
        finally:
            league.close()
    return SkillRun(seed, train_seconds, train_cpu_seconds, env_steps, iterations, final.losses, final.lines,
                    learner.last_snapshot, newest_report.losses, newest_report.lines,
                    format_perfect_play(final), load_before, load_after, tuple(traced))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the run's root seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the tic_tac_toe preset (repeatable)")
    parser.add_argument("--trace", action="store_true", help="evaluate after every iteration (not timed)")
    args = parser.parse_args()

    run = train_and_evaluate(args.seed, args.overrides, trace=args.trace)
    print(f"tic_tac_toe preset, seed {run.seed}{' ' + ' '.join(args.overrides) if args.overrides else ''}: "
          f"{run.iterations} iterations, {run.env_steps:,} env steps in {run.train_seconds:.1f} s "
          f"({run.steps_per_second:,.0f} steps/s); CPU time {run.train_cpu_seconds:.1f} s "
          f"({run.env_steps / max(run.train_cpu_seconds, 1e-9):,.0f} steps per CPU second)")
    print(f"load average (1, 5, 15 min) before {run.load_before[0]:.1f} {run.load_before[1]:.1f} "
          f"{run.load_before[2]:.1f}, after {run.load_after[0]:.1f} {run.load_after[1]:.1f} "
          f"{run.load_after[2]:.1f} on {os.cpu_count()} cores")
    print("learner's final weights:")
    print(run.report_text)
    print(f"newest snapshot {run.snapshot_id}: {run.snapshot_losses} lost of {run.snapshot_lines} lines")
    if args.trace:
        since = run.perfect_since()
        print("perfect (0 lost lines) from iteration "
              f"{since[0]} ({since[1]:,} env steps) on" if since else "never perfect for good")
    print(f"training: {run.train_seconds:.1f} s wall clock, {run.train_cpu_seconds:.1f} s CPU "
          f"(budget {TIME_BUDGET_S:.0f} s on a quiet machine), {run.env_steps:,} env steps")
    passed = run.learner_losses == GOAL_LOSSES
    print(f"goal ttt_perfect_play_losses: {run.learner_losses} (target {GOAL_LOSSES}) {'PASS' if passed else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
