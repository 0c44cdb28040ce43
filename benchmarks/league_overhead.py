"""League bookkeeping overhead with 1,000 snapshots in the population.

Runs the `connect_four` preset's league (serial backend) seeded with 1,000 frozen snapshots and
measures, per iteration, the manager's time in matchmaking (PFSP over the payoff table,
rating-match scheduling over 1,000 TrueSkill ratings) and in recording results (TrueSkill
updates, payoff updates — and, conservatively, the SQLite ledger writes too), against the
manager's whole iteration (playing, learning, snapshots, checkpoints included).

    python benchmarks/league_overhead.py [--members 1000] [--iterations 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path


GOAL = 0.05


def make_snapshots(directory: Path, count: int) -> list[str]:
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot
    from ludus.games.registry import spec as game_spec

    spec = game_spec("connect_four")
    config = NetConfig(hidden=(16,))
    paths = []
    for i in range(count):
        torch.manual_seed(i)
        paths.append(str(save_snapshot(ActorCritic(spec, config), spec, config, directory / f"s{i:04d}").path))
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--matches", type=int, default=1024, help="training matches per iteration")
    args = parser.parse_args()
    from ludus.league.api import League, load_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        paths = make_snapshots(tmp / "population", args.members)
        print(f"made {len(paths)} snapshots in {time.perf_counter() - start:.1f} s")
        config = load_config("connect_four", [
            f"iterations={args.iterations}", f"matches_per_iteration={args.matches}", "num_envs=512",
            "log.progress=false", "log.wandb=disabled", "log.tensorboard=false",
            # PFSP and rating matches over the whole population, not only the newest 32.
            f"max_opponents_per_iteration={args.members + 8}",
        ])
        config = dataclasses.replace(config, seed_population=tuple(paths))
        start = time.perf_counter()
        league = League.create(config, tmp / "run")
        print(f"league created with {len(league.population)} members in {time.perf_counter() - start:.1f} s")
        try:
            summaries = league.run()
        finally:
            league.close()
    total = sum(s.seconds for s in summaries)
    phases = {k: sum(s.phase_seconds[k] for s in summaries) for k in summaries[0].phase_seconds}
    for name, seconds in phases.items():
        print(f"  {name:<12} {seconds:8.2f} s  {seconds / total:6.1%}")
    overhead = (phases["matchmaking"] + phases["record"]) / total
    print(f"matchmaking + recording (ratings, payoff, ledger) per iteration: "
          f"{(phases['matchmaking'] + phases['record']) / len(summaries) * 1e3:.0f} ms of "
          f"{total / len(summaries) * 1e3:.0f} ms")
    print(f"goal league_overhead: {overhead:.3f} (target < {GOAL}) {'PASS' if overhead < GOAL else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
