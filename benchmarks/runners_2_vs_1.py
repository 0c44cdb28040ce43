"""Runner scaling: two runner processes against one, relative to the machine's own scaling.

A machine with two cores rarely doubles throughput with two processes (shared caches, memory
bandwidth, turbo, other load). So the goal compares the league's process backend against the
best this machine does on the same kind of work, measured in the same run:

* engine scaling: the native numpy connect four engine with random legal moves, one process
  vs two processes at once (total moves/s);
* runner scaling: `ProcessBackend` with one worker vs two workers, each playing the same
  tasks (torch snapshot policies on both seats, learner trajectories recorded).

The four measurements are interleaved: each round measures the engine with one process, the
runners with one worker, the engine with two processes and the runners with two workers, one
right after the other (both backends stay up for the whole run), so a change of load hits all
four alike; a round's figure is (runner 2/1) / (engine 2/1), and the goal is the median over
rounds (target >= 0.9). The raw runner ratio is printed too.

    python benchmarks/runners_2_vs_1.py [--matches 4096] [--boards 1024] [--rounds 5]
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

GOAL = 0.9


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

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot
    from ludus.games.registry import spec as game_spec
    from ludus.league.records.population import Member

    spec = game_spec("connect_four")
    members = []
    for i in range(count):
        torch.manual_seed(i)
        ref = save_snapshot(ActorCritic(spec, NetConfig()), spec, NetConfig(), directory / f"snap{i}")
        members.append(Member(f"snap{i}", "snapshot", "main", snapshot_path=str(ref.path), snapshot_id=ref.snapshot_id))
    return spec, members


def tasks_for(num_tasks: int, matches: int, members, round_id: int):
    from ludus.league.play.runner import MatchAssignment, PlayTask

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


class RunnerRate:
    """A process backend with `workers` workers, kept up between measurements."""

    def __init__(self, workers: int, members, spec, boards: int):
        import torch

        from ludus.agents.nets import ActorCritic, NetConfig
        from ludus.league.play.backends import LearnerWeights, ProcessBackend
        from ludus.league.learners.base import ActorCriticArchitecture, module_weights

        torch.manual_seed(123)
        learner = ActorCritic(spec, NetConfig())
        self.weights = [LearnerWeights("learner", 0, module_weights(learner))]
        self.members = members
        self.backend = ProcessBackend("connect_four", spec, ActorCriticArchitecture(NetConfig()),
                                      boards, 32, num_workers=workers)
        self.backend.set_population(members)
        # warm-up: imports, snapshot loads
        self.backend.collect(self.backend.submit(tasks_for(workers, 64, members, 999), self.weights))

    def measure(self, matches: int, round_id: int) -> float:
        """Moves/s over two tasks of `matches` matches (the same work whatever the worker count)."""
        start = time.perf_counter()
        results = self.backend.collect(self.backend.submit(tasks_for(2, matches, self.members, round_id), self.weights))
        return sum(res.env_steps for res in results) / (time.perf_counter() - start)

    def close(self) -> None:
        self.backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matches", type=int, default=4096, help="matches per task (two tasks per round)")
    parser.add_argument("--boards", type=int, default=1024, help="games stepped at once per runner")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the goal is their median")
    parser.add_argument("--engine-seconds", type=float, default=2.0)
    args = parser.parse_args()
    figures, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        spec, members = make_population(Path(tmp), 8)
        one, two = RunnerRate(1, members, spec, args.boards), RunnerRate(2, members, spec, args.boards)
        try:
            for r in range(args.rounds):
                engine_1 = engine_rate(1, args.engine_seconds, 4096)
                runner_1 = one.measure(args.matches, r)
                engine_2 = engine_rate(2, args.engine_seconds, 4096)
                runner_2 = two.measure(args.matches, r)
                engine_scaling, runner_scaling = engine_2 / engine_1, runner_2 / runner_1
                figures.append(runner_scaling / engine_scaling)
                rows.append((engine_scaling, runner_scaling))
                print(f"round {r + 1}: engine {engine_1 / 1e6:.2f}M -> {engine_2 / 1e6:.2f}M moves/s "
                      f"({engine_scaling:.2f}x); runners {runner_1 / 1e3:.1f}k -> {runner_2 / 1e3:.1f}k moves/s "
                      f"({runner_scaling:.2f}x); figure {figures[-1]:.2f}", flush=True)
        finally:
            one.close()
            two.close()
    figure = float(np.median(figures))
    print(f"median over {args.rounds} rounds: runner scaling {np.median([r[1] for r in rows]):.2f}x, "
          f"engine scaling {np.median([r[0] for r in rows]):.2f}x")
    print(f"goal runners_2_vs_1: {figure:.3f} (target {GOAL}) {'PASS' if figure >= GOAL else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
