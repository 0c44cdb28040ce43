"""Runner scaling: two runner processes against one, relative to the machine's own scaling.

A machine with two cores rarely doubles throughput with two processes (shared caches, memory
bandwidth, turbo, other load). So the goal compares the league's process backend against the
best this machine does on the same kind of work, measured in the same run:

* engine scaling: the native numpy connect four engine with random legal moves, one process
  vs two processes at once (total moves/s);
* runner scaling: `ProcessBackend` with one worker vs two workers, each playing the same
  tasks (torch snapshot policies on both seats, learner trajectories recorded).

goal = runner scaling / engine scaling (target >= 0.8); the raw runner ratio is printed too.

    python benchmarks/runners_2_vs_1.py [--matches 4096] [--boards 1024]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

GOAL = 0.8


def _engine_worker(seconds: float, boards: int, queue) -> None:
    from game_speed import NativeRun

    run = NativeRun(boards, np.random.default_rng(0))
    queue.put(run.measure(seconds)[0])


def engine_rate(processes: int, seconds: float, boards: int) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_engine_worker, args=(seconds, boards, queue)) for _ in range(processes)]
    for w in workers:
        w.start()
    rates = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    return float(sum(rates))


def make_population(directory: Path, count: int):
    """`count` random-weight snapshots of connect four nets, as league members."""
    import torch

    from agents.nets import ActorCritic, NetConfig
    from agents.snapshot import save_snapshot
    from games.registry import spec as game_spec
    from league.population import Member

    spec = game_spec("connect_four")
    members = []
    for i in range(count):
        torch.manual_seed(i)
        ref = save_snapshot(ActorCritic(spec, NetConfig()), spec, NetConfig(), directory / f"snap{i}")
        members.append(Member(f"snap{i}", "snapshot", "main", snapshot_path=str(ref.path), snapshot_id=ref.snapshot_id))
    return spec, members


def tasks_for(num_tasks: int, matches: int, members, round_id: int):
    from league.runner import MatchAssignment, PlayTask

    tasks = []
    for t in range(num_tasks):
        base = (round_id * num_tasks + t) * matches
        assignments = tuple(
            MatchAssignment(base + j, base + j, ("learner", members[j % len(members)].player_id) if j % 2 else
                            (members[j % len(members)].player_id, "learner"))
            for j in range(matches))
        tasks.append(PlayTask(task_id=base, assignments=assignments, sample_seed=base, learners=("learner",),
                              learner_versions=(0,)))
    return tasks


def runner_rate(workers: int, members, spec, matches: int, boards: int, rounds: int) -> float:
    import torch

    from agents.nets import ActorCritic, NetConfig
    from league.backends import LearnerWeights, ProcessBackend
    from league.learners import ActorCriticArchitecture, module_weights

    torch.manual_seed(123)
    learner = ActorCritic(spec, NetConfig())
    weights = [LearnerWeights("learner", 0, module_weights(learner))]
    backend = ProcessBackend("connect_four", spec, ActorCriticArchitecture(NetConfig()),
                             boards, 32, num_workers=workers)
    try:
        backend.set_population(members)
        backend.collect(backend.submit(tasks_for(workers, 64, members, 999), weights))  # warm-up: imports, loads
        moves, start = 0, time.perf_counter()
        for r in range(rounds):
            # Two tasks per round whatever the worker count: the same work for both settings.
            results = backend.collect(backend.submit(tasks_for(2, matches, members, r), weights))
            moves += sum(res.env_steps for res in results)
        return moves / (time.perf_counter() - start)
    finally:
        backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matches", type=int, default=4096, help="matches per task (two tasks per round)")
    parser.add_argument("--boards", type=int, default=1024, help="games stepped at once per runner")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine-seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec, members = make_population(Path(tmp), 8)
        engine_1 = engine_rate(1, args.engine_seconds, 4096)
        engine_2 = engine_rate(2, args.engine_seconds, 4096)
        runner_1 = runner_rate(1, members, spec, args.matches, args.boards, args.rounds)
        runner_2 = runner_rate(2, members, spec, args.matches, args.boards, args.rounds)
    engine_scaling, runner_scaling = engine_2 / engine_1, runner_2 / runner_1
    print(f"engine: 1 process {engine_1 / 1e6:.2f}M moves/s, 2 processes {engine_2 / 1e6:.2f}M moves/s "
          f"-> scaling {engine_scaling:.2f}x")
    print(f"runners: 1 worker {runner_1 / 1e3:.1f}k moves/s, 2 workers {runner_2 / 1e3:.1f}k moves/s "
          f"-> raw ratio {runner_scaling:.2f}x")
    figure = runner_scaling / engine_scaling
    print(f"runner scaling / engine scaling = {runner_scaling:.2f} / {engine_scaling:.2f}")
    print(f"goal runners_2_vs_1: {figure:.2f} (target {GOAL}) {'PASS' if figure >= GOAL else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
