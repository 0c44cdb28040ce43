"""Skill of a league on a poker game: exploitability of its output policy within a time budget.

The shared machinery of `kuhn_skill.py` and `leduc_skill.py`. For each seed, trains the preset (on
Kuhn a PSRO league, whose output is the meta-strategy of the population's exact meta-game,
league/psro.py; on Leduc self-play whose output is the average of its snapshots) for a wall-clock
budget of training time, in its own process, and measures exactly, with OpenSpiel's best responses
(`ludus.evaluation.league_hooks.exploitability_metrics`, what `ludus train` logs):

* the league's output policy (league/output.py), its members aggregated reach-weighted into one
  behaviour policy;
* the main agent's last iterate: its newest snapshot.

Measuring pauses the training clock, after a snapshot joins, at most once per `--eval-every`
seconds of training, and at the end. The machine is shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_seed(preset: str, seed: int, budget: float, run_dir: Path, overrides: list[str], eval_every: float) -> dict:
    """Train one seed for `budget` seconds of training time; the exploitability trace and final figures."""
    import torch

    from benchmarks.lm_training import budget_league
    from ludus.evaluation.league_hooks import exploitability_metrics

    torch.set_num_threads(1)
    league = budget_league(preset, seed, run_dir, overrides)
    role = league.config.main_role.name
    trace = []
    train_seconds = eval_seconds = 0.0
    last_eval = -eval_every

    def measure() -> dict:
        frozen = league.population.frozen()
        metrics = exploitability_metrics(league.spec, league.config, frozen, league.run_dir)  # what `ludus train` logs
        league.metrics.log(league.total_env_steps, metrics)
        return {"train_seconds": round(train_seconds, 2), "env_steps": league.total_env_steps,
                "iteration": league.iteration, "snapshots": sum(m.role == role for m in frozen),
                "output": metrics["eval/exploitability"], "main": metrics["eval/main_exploitability"],
                "main_snapshot": next(m.player_id for m in reversed(frozen) if m.role == role)}

    try:
        while train_seconds < budget:
            start = time.perf_counter()
            summary = league.run(until_iteration=league.iteration + 1)[-1]
            train_seconds += time.perf_counter() - start
            # the output changes only when snapshots join; at most one measurement per `eval_every`
            if (summary.snapshots and train_seconds - last_eval >= eval_every) or train_seconds >= budget:
                start = time.perf_counter()
                trace.append(measure())
                eval_seconds += time.perf_counter() - start
                last_eval = train_seconds
    finally:
        league.close()
    return {"seed": seed, "budget": budget, "train_seconds": train_seconds, "eval_seconds": eval_seconds,
            "trace": trace, "final": trace[-1]}


def _worker_command(args: argparse.Namespace, seed: int, run_dir: Path) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--preset", args.preset, "--seeds", str(seed),
               "--budget", str(args.budget), "--eval-every", str(args.eval_every), "--run-root", str(run_dir)]
    for item in args.set:
        command += ["--set", item]
    return command


def _run_all(args: argparse.Namespace, root: Path) -> list[dict]:
    """Each seed in its own process (a clean torch and a fair clock), `parallel` at a time."""
    pending = list(args.seeds)
    running: list[tuple[int, subprocess.Popen, Path]] = []
    results = []
    while pending or running:
        while pending and len(running) < args.parallel:
            seed = pending.pop(0)
            out = root / f"seed-{seed}.json"
            process = subprocess.Popen(_worker_command(args, seed, root / f"seed-{seed}"), stdout=out.open("w"))
            running.append((seed, process, out))
        time.sleep(1.0)
        for item in list(running):
            seed, process, out = item
            if process.poll() is None:
                continue
            running.remove(item)
            if process.returncode != 0:
                raise SystemExit(f"seed {seed} failed (exit {process.returncode}); see {out}")
            results.append(json.loads(out.read_text()))
    return sorted(results, key=lambda r: r["seed"])


def _value_at(trace: list[dict], seconds: float, key: str) -> float | None:
    """The last measurement taken at or before `seconds` of training."""
    before = [r[key] for r in trace if r["train_seconds"] <= seconds]
    return before[-1] if before else None


def _time_to(trace: list[dict], threshold: float) -> float | None:
    return next((r["train_seconds"] for r in trace if r["output"] <= threshold), None)


def add_arguments(parser: argparse.ArgumentParser, preset: str) -> None:
    """The command line every poker skill benchmark shares."""
    parser.add_argument("--preset", default=preset, help="the league preset trained")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds per seed")
    parser.add_argument("--parallel", type=int, default=1, help="seeds trained at once")
    parser.add_argument("--eval-every", type=float, default=10.0,
                        help="also measure every this many training seconds (always after each snapshot)")
    parser.add_argument("--set", action="append", default=[], help="preset override key=value (repeatable)")
    parser.add_argument("--run-root", type=Path, default=None, help="where run directories go (default: temp)")


def train_seeds(args: argparse.Namespace) -> tuple[list[dict], list[tuple[float, float, float]]]:
    """Every seed's result (each in its own process) and the load average before and after."""
    loads = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="poker-skill-") as tmp:
        root = args.run_root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        results = _run_all(args, root)
    loads.append(os.getloadavg())
    return results, loads


def report(results: list[dict], loads: list[tuple[float, float, float]], title: str, target: float) -> float:
    """Print the traces; returns the worst final output exploitability over seeds."""
    print(f"\n{title}, {len(results)} seeds x {results[0]['budget']:.0f} s of training each")
    print("load average (1/5/15 min) at start and end: " + "  ".join("/".join(f"{x:.1f}" for x in load)
                                                                    for load in loads) + "  on "
          f"{os.cpu_count()} cores")
    marks = [t for t in (30, 60, 120, 180, 240, 300, 420, 600) if t <= results[0]["budget"]]
    print("\nexploitability of the league's output policy by training time:")
    print(f"{'seed':>4} " + " ".join(f"{f'{t}s':>7}" for t in marks) + f" {'final':>7} {f'to {target}':>8}"
          f" {'snapshots':>9} {'env steps':>10}")
    for r in results:
        cells = []
        for t in marks:
            v = _value_at(r["trace"], t, "output")
            cells.append(f"{v:7.4f}" if v is not None else f"{'-':>7}")
        reach = _time_to(r["trace"], target)
        final = r["final"]
        print(f"{r['seed']:>4} " + " ".join(cells) + f" {final['output']:7.4f} "
              f"{(f'{reach:.0f}s' if reach is not None else 'never'):>8} {final['snapshots']:>9} "
              f"{final['env_steps']:>10,}")
    print("\nmain agent's last iterate (its newest snapshot):")
    for r in results:
        final = r["final"]
        best = min(x["main"] for x in r["trace"])
        print(f"  seed {r['seed']}: {final['main_snapshot']} exploitability {final['main']:.4f} "
              f"(ratio to the output policy {final['main'] / max(final['output'], 1e-9):.1f}x; best snapshot "
              f"of the run {best:.4f}); training {r['train_seconds']:.0f} s, measuring {r['eval_seconds']:.1f} s")
    return max(r["final"]["output"] for r in results)


def main(argv: list[str] | None = None) -> int:
    """The worker: one seed of one preset, its result as JSON on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, "kuhn_poker")
    args = parser.parse_args(argv)
    (seed,) = args.seeds
    json.dump(run_seed(args.preset, seed, args.budget, args.run_root, args.set, args.eval_every), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
