"""How long `ludus status RUN` takes, as a user types it: a fresh process, imports included.

Trains a small real run (`ludus train quickstart`, serial backend), then grows a copy of its
ledger to the size of a long run (`--matches`, default 600k: a 15-minute `connect_four` league
records about 600 iterations x 1,024 matches) by appending training and rating matches of its own
members through `Store.record_matches`, as the manager would. `ludus status` is timed on both
runs, `--repeats` times each, interleaved, in a new Python process each time; the figure is the
median wall time on the large run.

    python benchmarks/status_latency.py [--matches 600000] [--repeats 9]

Ends with ``goal status_latency_ms: <median ms on the large run> (target 300) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_MS = 300.0


def grow_ledger(run_dir: Path, matches: int, seed: int = 0) -> int:
    """Append matches between the run's members until its ledger holds `matches`; the new count."""
    import numpy as np

    from ludus.league.records.ledger import MatchResult, SeatResult, Store, outcomes_from_returns
    from ludus.league.rundata import read_run

    run = read_run(run_dir)
    players = [m.player_id for m in run.members]
    rng = np.random.default_rng(seed)
    with Store.open(run_dir) as store:
        next_id = store.max_match_id() + 1
        count = store.count_matches()
        while count < matches:
            batch = []
            for _ in range(min(4096, matches - count)):
                a, b = rng.choice(len(players), size=2, replace=False)
                first = float(rng.choice([-1.0, 0.0, 1.0]))
                returns = [first, -first]
                outcomes = outcomes_from_returns(returns)
                seats = tuple(SeatResult(seat=s, team=s, player_id=players[p], episode_return=returns[s],
                                         outcome=outcomes[s]) for s, p in enumerate((a, b)))
                batch.append(MatchResult(match_id=next_id, kind="training" if next_id % 10 else "rating",
                                         game_id=run.game_id, seed=next_id, seats=seats, length=int(rng.integers(5, 10)),
                                         started_at=time.time(), duration_s=0.01))
                next_id += 1
            store.record_matches(batch)
            count += len(batch)
    return count


def time_status(run_dir: Path) -> float:
    """Wall seconds of `python -m ludus status RUN` in a fresh process (output discarded)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ludus", "status", str(run_dir)], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, WANDB_MODE="disabled"))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matches", type=int, default=600_000, help="matches in the large run's ledger")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ludus-status-") as tmp:
        small = Path(tmp) / "quickstart"
        subprocess.run([sys.executable, "-m", "ludus", "train", "quickstart", "--run", str(small), "--set",
                        "log.progress=false", "--set", "log.wandb=disabled", "--set", "log.tensorboard=false"],
                       check=True, stdout=subprocess.DEVNULL)
        large = Path(tmp) / "large"
        shutil.copytree(small, large)
        start = time.perf_counter()
        total = grow_ledger(large, args.matches)
        print(f"runs: {small.name} as trained; {large.name} = a copy grown to {total:,} matches "
              f"({time.perf_counter() - start:.0f} s to write)")
        times: dict[str, list[float]] = {"quickstart": [], "large": []}
        for _ in range(args.repeats):
            for name, run in (("quickstart", small), ("large", large)):
                times[name].append(time_status(run))
        from ludus.league.records.ledger import Store

        with Store.open(small, mode="read") as store:
            small_matches = store.count_matches()
    for name, values in times.items():
        matches = small_matches if name == "quickstart" else total
        print(f"ludus status on {name:<10} ({matches:>9,} matches): median {1000 * statistics.median(values):6.0f} ms "
              f"(min {1000 * min(values):.0f}, max {1000 * max(values):.0f}) over {len(values)} runs")
    figure = 1000 * statistics.median(times["large"])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"goal status_latency_ms: {figure:.0f} (target {TARGET_MS:.0f}) {'PASS' if figure <= TARGET_MS else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
