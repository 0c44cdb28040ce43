"""Runners on Ray (one local node, or a simulated cluster of several) vs runners in worker
processes, same tasks, side by side.

Both backends play the same connect-four tasks (a small learner net against itself, a frozen
snapshot and the random bot) with 2 runners; the learner's weights get a new version every
round, as in a league iteration, so shipping weights is part of the cost (a file-free `ray.put`
per version for Ray, a pipe message per worker for processes). Rounds alternate between the
backends so that load from other work on the machine hits both alike; the figure is the ratio
of the medians of env steps/s (target: Ray keeps at least 0.8x of the process backend).

With `--nodes 2` Ray is a cluster of two simulated nodes on this machine
(`ray.cluster_utils.Cluster`, each node its own raylet and object store, one CPU each), the
runners are spread one per node, and weights and snapshots travel between nodes' object stores:
the same cores as the process backend, the cost of a cluster's plumbing (goal
ray_cluster_vs_process). Both backends' first rounds must play identical matches.

Ray binds the machine's external interface, so the script re-executes itself inside a network
namespace with only loopback (`unshare -n`, needs root) unless it already runs in one.

    python benchmarks/ray_vs_multiprocess.py [--rounds 10] [--matches 512] [--nodes 2]
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
    parser.add_argument("--nodes", type=int, default=1,
                        help="Ray nodes: 1 starts a local Ray; more simulate a cluster (ray.cluster_utils)")
    args = parser.parse_args()

    import numpy as np
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot
    from ludus.games.registry import spec as game_spec
    from ludus.league.play.backends import LearnerWeights, ProcessBackend
    from ludus.league.learners.base import ActorCriticArchitecture
    from ludus.league.seeds import match_seed
    from ludus.league.records.population import Member
    from ludus.league.play.ray_backend import RayBackend
    from ludus.league.play.runner import MatchAssignment, PlayTask

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

    def play(backend, version: int, round_tasks=None) -> tuple[float, float, list]:
        """(env steps/s, share of the wall time the runners spent inside Runner.play, the results).
        `round_tasks`: play these (tasks, weights) instead of a new round (round_of perturbs the weights)."""
        tasks, weights = round_tasks or round_of(version)
        start = time.perf_counter()
        results = backend.collect(backend.submit(tasks, weights))
        wall = time.perf_counter() - start
        return sum(r.env_steps for r in results) / wall, max(r.seconds for r in results) / wall, results

    print(f"{game}: {args.runners} runners x {args.num_envs} games, {args.matches} matches per round, "
          f"MLP {net_config.hidden}, {args.rounds} timed rounds per backend")
    start = time.perf_counter()
    cluster = None
    if args.nodes > 1:
        import math

        from ray.cluster_utils import Cluster

        # Each node gets the CPUs for its share of runners (RUNNER_CPUS each): the same cores in all.
        from ludus.league.play.ray_backend import RUNNER_CPUS

        per_node = max(1, math.ceil(args.runners * RUNNER_CPUS / args.nodes))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": per_node, "include_dashboard": False})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=per_node)
        cluster.wait_for_nodes()
    backends = {
        "process": ProcessBackend(game, spec, architecture, args.num_envs, cache_size=4, num_workers=args.runners),
        "ray": RayBackend(game, spec, architecture, args.num_envs, cache_size=4, num_workers=args.runners,
                          address=cluster.address if cluster else None),
    }
    nodes = len({node for _, node, _ in backends["ray"].runners})
    print(f"startup (both backends, Ray included): {time.perf_counter() - start:.1f} s; Ray runners on {nodes} "
          f"node(s) of {args.nodes}")
    rates: dict[str, list[float]] = {name: [] for name in backends}
    busy: dict[str, list[float]] = {name: [] for name in backends}
    first: dict[str, list] = {}
    try:
        warm_up = round_of(0)  # the same tasks and weights for both: their results must be equal
        for name, backend in backends.items():
            backend.set_population(members)
            first[name] = play(backend, 0, warm_up)[2]  # warm-up: worker imports, snapshot loads, first weights
        for version in range(1, args.rounds + 1):
            # Alternate which backend goes first, so neither always follows the other's work.
            for name in (list(backends) if version % 2 else list(backends)[::-1]):
                rate, share, _ = play(backends[name], version)
                rates[name].append(rate)
                busy[name].append(share)
    finally:
        for backend in backends.values():
            backend.close()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    same = all(a.matches == b.matches and a.env_steps == b.env_steps for a, b in zip(first["process"], first["ray"]))
    print(f"first round: {'identical matches and returns' if same else 'DIFFERENT matches'} on both backends")
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"{name:<8} {medians[name]:>10,.0f} env steps/s, runners busy {statistics.median(busy[name]):.0%} "
              f"of the wall time  (rounds: {', '.join(f'{x:,.0f}' for x in r)})")
    ratio = medians["ray"] / medians["process"]
    spread = float(np.std(np.array(rates["ray"]) / np.array(rates["process"])))
    print(f"ray / process: {ratio:.2f} (median rates; the per-round ratio spreads +- {spread:.2f} on this machine)")
    goal = "ray_vs_multiprocess" if args.nodes == 1 else "ray_cluster_vs_process"
    passed = ratio >= 0.8 and same
    print(f"goal {goal}: {ratio:.2f}x (target 0.8x, equal results) {'PASS' if passed else 'FAIL'}")


if __name__ == "__main__":
    if os.environ.get(INSIDE_NAMESPACE) != "1":
        reexec_in_loopback_namespace()
    main()
