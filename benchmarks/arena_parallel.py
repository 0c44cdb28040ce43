"""Parallel arena matches: a connect four round-robin of 4 agents with 2 workers vs 1.

Four sandboxed agents that think like real ones (tests/agents/thinker: a fixed amount of CPU time
per move, `--think` seconds, then a legal move) play a round-robin (`--games-per-pair` games per
pair) on connect four, once with one match at a time and once with two (`--workers`), repeated
`--repeats` times with the two settings interleaved so that a change of machine load hits both.
The figure is the ratio of the median wall-clock times; each agent's CPU quota (a cgroup, one
core) and its own process keep the parallel matches apart. The two ledgers are also checked to be
equal (parallel play records what serial play does).

    python benchmarks/arena_parallel.py [--repeats 3] [--think 0.03]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from ludus.arena.api import Arena, ArenaConfig
from ludus.arena.match import MatchLimits

REPO = Path(__file__).resolve().parent.parent
THINKER = REPO / "tests" / "agents" / "thinker"
GAME = "connect_four"
TARGET = 1.6


def tournament(root: Path, workers: int, think_s: float, games_per_pair: int) -> tuple[float, list]:
    config = ArenaConfig(match_limits=MatchLimits(time_per_move_s=max(1.0, 20 * think_s), overage_s=5.0),
                         extra_env=(("LUDUS_THINK_CPU_S", str(think_s)),))
    arena = Arena.open(root / f"arena-{workers}-{time.monotonic_ns()}", GAME, config)
    for name in ("a", "b", "c", "d"):
        arena.submit(THINKER, name=f"thinker-{name}")
    began = time.perf_counter()
    report = arena.run_tournament(format="round-robin", games_per_pair=games_per_pair, seed=7, workers=workers)
    elapsed = time.perf_counter() - began
    faults = [m for m in report.matches if any(s != "ok" for s in m.statuses)]
    if faults:
        raise SystemExit(f"arena_parallel: {len(faults)} matches forfeited (machine overloaded?): "
                         f"{faults[0].reasons}")
    return elapsed, [(m.match_id, m.players, m.returns, m.moves) for m in report.matches]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--think", type=float, default=0.03, help="CPU seconds each agent spends per move")
    parser.add_argument("--games-per-pair", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], args.workers: []}
    ledgers = {}
    with tempfile.TemporaryDirectory(prefix="ludus-arena-bench-") as tmp:
        for _ in range(args.repeats):
            for workers in (1, args.workers):  # interleaved: load changes hit both settings
                elapsed, ledger = tournament(Path(tmp), workers, args.think, args.games_per_pair)
                times[workers].append(elapsed)
                ledgers[workers] = ledger
    matches = len(ledgers[1])
    serial, parallel = statistics.median(times[1]), statistics.median(times[args.workers])
    print(f"{matches} connect four matches among 4 agents thinking {args.think * 1000:.0f} ms of CPU a move; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    print(f"  1 worker:  {' '.join(f'{t:.1f}' for t in times[1])} s (median {serial:.1f} s)")
    print(f"  {args.workers} workers: {' '.join(f'{t:.1f}' for t in times[args.workers])} s (median {parallel:.1f} s)")
    print(f"  ledgers equal: {ledgers[1] == ledgers[args.workers]}")
    ratio = serial / parallel
    ok = ratio >= TARGET and ledgers[1] == ledgers[args.workers]
    print(f"goal arena_parallel_speedup: {ratio:.2f}x (target {TARGET}x) {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
