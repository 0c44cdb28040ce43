"""Runners on Ray vs runners in worker processes, same tasks, side by side.

Both backends play the same connect-four tasks (a small learner net against itself, a frozen
snapshot and the random bot) with 2 runners; the learner's weights get a new version every
round, as in a league iteration, so shipping weights is part of the cost (a file-free `ray.put`
per version for Ray, a pipe message per worker for processes). Rounds alternate between the
backends so that load from other work on the machine hits both alike; the figure is the ratio
of the medians of env steps/s (target: Ray keeps at least 0.8x of the process backend).

Ray binds the machine's external interface, so the script re-executes itself inside a network
namespace with only loopback (`unshare -n`, needs root) unless it already runs in one.

    python benchmarks/ray_vs_multiprocess.py [--rounds 10] [--matches 512]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

INSIDE_NAMESPACE = "LUDUS_BENCH_LOOPBACK_ONLY"


def reexec_in_loopback_namespace() -> None:
    os.environ[INSIDE_NAMESPACE] = "1"
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per backend")
    parser.add_argument("--matches", type=int, default=512, help="matches per round (split over the runners)")
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--num-envs", type=int, default=64, help="games each runner steps at once")
    args = parser.parse_args()

    import numpy as np
    import torch

    from agents.nets import ActorCritic, NetConfig
    from agents.snapshot import save_snapshot
    from games.registry import spec as game_spec
    from league.backends import LearnerWeights, ProcessBackend
    from league.learners import ActorCriticArchitecture
    from league.seeds import match_seed
    from league.population import Member
    from league.ray_backend import RayBackend
    from league.runner import MatchAssignment, PlayTask

    game = "connect_four"
    spec, net_config = game_spec(game), NetConfig(hidden=(64, 64))
    architecture = ActorCriticArchitecture(net_config)
    torch.manual_seed(0)
    learner = ActorCritic(spec, net_config)
    scratch = Path(tempfile.mkdtemp(prefix="ludus-bench-"))
    ref = save_snapshot(ActorCritic(spec, net_config), spec, net_config, scratch / "main@0")
    members = [Member("main@0", "snapshot", "main", snapshot_path=str(ref.path), snapshot_id=ref.snapshot_id),
               Member("anchor:random", "anchor", "anchor", bot="random")]
    pairings = [("main", "main"), ("main", "main@0"), ("main@0", "main"), ("main", "anchor:random"),
                ("anchor:random", "main")]

    def round_of(version: int) -> tuple[list[PlayTask], list[LearnerWeights]]:
        with torch.no_grad():  # a new policy version: perturb the weights a little
            for p in learner.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
        weights = LearnerWeights("main", version, {k: v.numpy().copy() for k, v in learner.state_dict().items()})
        per_task = args.matches // args.runners
        tasks = []
        for shard in range(args.runners):
            first = (version * args.runners + shard) * per_task
            assignments = tuple(MatchAssignment(first + j, match_seed(0, first + j), pairings[j % len(pairings)])
                                for j in range(per_task))
            tasks.append(PlayTask(version * args.runners + shard, assignments, sample_seed=version * 97 + shard,
                                  learners=("main",), learner_versions=(version,)))
        return tasks, [weights]

    def play(backend, version: int) -> tuple[float, float]:
        """(env steps/s, share of the wall time the runners spent inside Runner.play)."""
        tasks, weights = round_of(version)
        start = time.perf_counter()
        results = backend.collect(backend.submit(tasks, weights))
        wall = time.perf_counter() - start
        return sum(r.env_steps for r in results) / wall, max(r.seconds for r in results) / wall

    print(f"{game}: {args.runners} runners x {args.num_envs} games, {args.matches} matches per round, "
          f"MLP {net_config.hidden}, {args.rounds} timed rounds per backend")
    start = time.perf_counter()
    backends = {
        "process": ProcessBackend(game, spec, architecture, args.num_envs, cache_size=4, num_workers=args.runners),
        "ray": RayBackend(game, spec, architecture, args.num_envs, cache_size=4, num_workers=args.runners),
    }
    print(f"startup (both backends, Ray included): {time.perf_counter() - start:.1f} s")
    rates: dict[str, list[float]] = {name: [] for name in backends}
    busy: dict[str, list[float]] = {name: [] for name in backends}
    try:
        for backend in backends.values():
            backend.set_population(members)
            play(backend, 0)  # warm-up: worker imports, snapshot loads, first weights
        for version in range(1, args.rounds + 1):
            # Alternate which backend goes first, so neither always follows the other's work.
            for name in (list(backends) if version % 2 else list(backends)[::-1]):
                rate, share = play(backends[name], version)
                rates[name].append(rate)
                busy[name].append(share)
    finally:
        for backend in backends.values():
            backend.close()
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"{name:<8} {medians[name]:>10,.0f} env steps/s, runners busy {statistics.median(busy[name]):.0%} "
              f"of the wall time  (rounds: {', '.join(f'{x:,.0f}' for x in r)})")
    ratio = medians["ray"] / medians["process"]
    spread = float(np.std(np.array(rates["ray"]) / np.array(rates["process"])))
    print(f"ray / process: {ratio:.2f} (median rates; the per-round ratio spreads +- {spread:.2f} on this machine)")
    print(f"goal ray_vs_multiprocess: {ratio:.2f}x (target 0.8x) {'PASS' if ratio >= 0.8 else 'FAIL'}")


if __name__ == "__main__":
    if os.environ.get(INSIDE_NAMESPACE) != "1":
        reexec_in_loopback_namespace()
    main()
