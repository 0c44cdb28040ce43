"""Exact resume under kill -9: 20 runs, each killed at a random moment, resumed, and compared.

The run is the `connect_four` preset's kind, scaled down: asynchronous (`pipeline_depth: 2`, the
next iteration planned and played while this one learns), two runner processes, anchors,
snapshots and rating matches. One uninterrupted run is the reference. Each trial starts the same
run, kills the manager and its runners (SIGKILL to the process group) at a random moment — while
the run is being created, or a random delay after a random iteration's checkpoint, so the kill
lands in planning, play, learning or checkpointing — runs `ludus resume` to the end, and counts
as exact when every ledger row (seq, id, seed, moves, returns, ratings history) and every
snapshot equal the reference's.

    python benchmarks/resume_kills.py [--trials 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
ITERATIONS = 10
ASYNC = ["game=connect_four", "pipeline_depth=2", "backend=process", "num_runners=2", f"iterations={ITERATIONS}",
         "matches_per_iteration=32", "num_envs=16", "snapshot_every_steps=300", "anchors=[random]",
         "net.hidden=[32]", "ppo.num_minibatches=2", "ppo.update_epochs=2", "rating_share=0.2",
         "log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]


def train_args(run_dir: Path, overrides: list[str]) -> list[str]:
    args = ["train", "quickstart", "--run", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    return args


def checkpointed_iteration(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "checkpoint.json").read_text())["iteration"]
    except (OSError, ValueError, KeyError):
        return -1


def run_with_kills(run_dir: Path, overrides: list[str], kills: list[tuple[int, float]]) -> int:
    """Train, and kill -9 the manager and its runners once per (iteration, delay) of `kills`: `delay`
    seconds after the run's checkpoint reaches `iteration` (-1: after the start, i.e. during the
    run's creation or loading); then resume until finished. Returns how many kills landed."""
    landed = 0
    pending = list(kills)
    while True:
        resuming = (run_dir / "checkpoint.json").exists()
        args = ["resume", str(run_dir)] if resuming else train_args(run_dir, overrides)
        proc = subprocess.Popen([sys.executable, "-m", "ludus", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=ENV, start_new_session=True)
        if pending:
            iteration, delay = pending.pop(0)
            while proc.poll() is None and checkpointed_iteration(run_dir) < iteration:
                time.sleep(0.01)
            time.sleep(delay)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the manager and its runner processes
                proc.wait()
                landed += 1
                continue
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(err.decode().strip())
        if not pending:
            return landed


def ledger_rows(run_dir: Path) -> list[tuple]:
    """The ledger without wall-clock fields, and the ratings history (`Store.comparable_rows`)."""
    from league.ledger import Store

    with Store.open(run_dir, mode="read") as store:
        return store.comparable_rows()


def snapshot_ids(run_dir: Path) -> dict[str, str]:
    return {m.parent.name: hashlib.sha256(m.read_bytes()).hexdigest()
            for m in sorted((run_dir / "snapshots").glob("*/manifest.json"))}


def random_kill(rng: np.random.Generator) -> tuple[int, float]:
    """While being created (one time in five), else a random delay after a random iteration."""
    if rng.random() < 0.2:
        return -1, float(rng.uniform(0.5, 4.0))
    return int(rng.integers(1, ITERATIONS - 1)), float(rng.uniform(0.0, 0.6))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ludus-kills-") as tmp:
        reference = Path(tmp) / "reference"
        run_with_kills(reference, ASYNC, [])
        expected_rows, expected_snapshots = ledger_rows(reference), snapshot_ids(reference)
        exact = landed = 0
        for trial in range(args.trials):
            run = Path(tmp) / f"trial-{trial}"
            kill = random_kill(rng)
            landed += run_with_kills(run, ASYNC, [kill])
            same = ledger_rows(run) == expected_rows and snapshot_ids(run) == expected_snapshots
            exact += same
            where = "during creation" if kill[0] < 0 else f"{kill[1]:.2f} s after iteration {kill[0]}"
            print(f"trial {trial + 1:2d}: killed {where}: {'exact' if same else 'DIFFERENT'}", flush=True)
            shutil.rmtree(run, ignore_errors=True)
    print(f"{landed} of {args.trials} kills landed before the run finished; {len(expected_rows)} ledger rows, "
          f"{len(expected_snapshots)} snapshots; {time.perf_counter() - started:.0f} s")
    print(f"goal resume_exact_kills: {exact}/{args.trials} (target {args.trials}/{args.trials}) "
          f"{'PASS' if exact == args.trials else 'FAIL'}")


if __name__ == "__main__":
    main()
