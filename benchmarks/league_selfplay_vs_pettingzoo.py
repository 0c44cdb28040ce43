"""League self-play speed on connect four against PettingZoo's random loop, in one process.

The league side is exactly what a runner does in `ludus train`: `Runner.play` on a task of
matches in which the learner (a torch ActorCritic) plays against frozen snapshot nets drawn by
PFSP from a payoff table (at least 8 distinct opponents per batch, asserted), both seats,
with observations, legal masks, batched inference per policy and the learner's trajectories
(SeatTrajectoryBuilder + GAE) all included. One torch thread. The reference is PettingZoo's
`connect_four_v3.env()` random-legal AEC loop, measured interleaved in the same run.

    python benchmarks/league_selfplay_vs_pettingzoo.py [--boards 4096] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from game_speed import PettingZooRun  # noqa: E402

from ludus.agents.kernels import grouped_linear_status  # noqa: E402
from ludus.agents.nets import ActorCritic  # noqa: E402
from ludus.agents.lm.pretrained import DTYPES  # noqa: E402
from ludus.agents.torch_policy import TorchPolicy  # noqa: E402
from ludus.games.registry import spec as game_spec  # noqa: E402
from ludus.league.api import load_config  # noqa: E402
from ludus.league.play.backends import make_runner  # noqa: E402
from ludus.league.records.matchmaking import MatchmakingMix, sample_opponents  # noqa: E402
from ludus.league.records.payoff import PayoffTable  # noqa: E402
from ludus.league.play.runner import MatchAssignment, PlayTask  # noqa: E402

GOAL = 40.0


def build_task(num_matches: int, num_snapshots: int, rng: np.random.Generator, start_id: int) -> PlayTask:
    """A learner's task with PFSP-drawn opponents over a payoff table of varied win rates."""
    payoff = PayoffTable()
    snapshots = [f"snap{i}" for i in range(num_snapshots)]
    for i, sid in enumerate(snapshots):
        wins = i % 5
        for g in range(6):
            payoff.update("learner", sid, 1.0 if g < wins else 0.0)
    opponents = sample_opponents(rng, MatchmakingMix(self_play=0.2, pfsp=0.8), "learner", snapshots, payoff,
                                 None, num_matches)
    distinct = len(set(opponents) - {"learner"})
    assert distinct >= 8, f"only {distinct} distinct PFSP opponents in the batch"
    assignments = tuple(
        MatchAssignment(start_id + j, start_id + j, ("learner", opp) if j % 2 == 0 else (opp, "learner"))
        for j, opp in enumerate(opponents))
    return PlayTask(task_id=start_id, assignments=assignments, sample_seed=start_id,
                    learners=("learner",), learner_versions=(0,))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boards", type=int, default=4096, help="games stepped at once by the runner")
    parser.add_argument("--matches", type=int, default=16384, help="matches per measured task")
    parser.add_argument("--snapshots", type=int, default=16, help="frozen snapshots in the PFSP pool")
    parser.add_argument("--inference-dtype", choices=["float32", "bfloat16"], default=None,
                        help="what the nets act in (default: the connect_four preset's inference_dtype)")
    parser.add_argument("--repeats", type=int, default=5, help="measurements; the goal is their median ratio")
    parser.add_argument("--seconds", type=float, default=2.0, help="PettingZoo seconds per repeat")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = game_spec("connect_four")
    # The connect_four preset's net (a 256-wide relu MLP whose actor and critic share the trunk),
    # acting in the preset's inference dtype, as its runners do.
    preset = load_config("connect_four")
    config = preset.net
    dtype = DTYPES[args.inference_dtype or preset.inference_dtype]
    print(f"net {config.kind} {list(config.hidden)} {config.activation}, acting in {dtype}; "
          f"the stack's grouped kernel (agents/kernels.py): {grouped_linear_status()}")
    policies = {}
    for i, pid in enumerate(["learner"] + [f"snap{i}" for i in range(args.snapshots)]):
        torch.manual_seed(i)
        # Frozen snapshots act without their critic, as the league loads them (league/records/population.py).
        policies[pid] = TorchPolicy(ActorCritic(spec, config).eval(), compute_values=pid == "learner", dtype=dtype)
    runner = make_runner("connect_four", args.boards, seed=0)
    rng = np.random.default_rng(0)
    pettingzoo = PettingZooRun(rng)
    runner.play(build_task(args.boards, args.snapshots, rng, 0), policies.__getitem__)  # warm-up
    league_rates, pz_rates = [], []
    for repeat in range(args.repeats):
        task = build_task(args.matches, args.snapshots, rng, (repeat + 1) * 10**6)
        start = time.perf_counter()
        result = runner.play(task, policies.__getitem__)
        elapsed = time.perf_counter() - start
        transitions = len(result.rollouts["learner"])
        assert transitions == result.learner_steps["learner"], "every learner move must be a transition"
        league_rates.append(result.env_steps / elapsed)
        pz_rates.append(pettingzoo.measure(args.seconds))
        print(f"repeat {repeat + 1}: league {league_rates[-1] / 1e3:.0f}k moves/s "
              f"({result.env_steps} moves, {transitions} learner transitions, inference "
              f"{result.inference_seconds / elapsed:.0%} of the time)  pettingzoo {pz_rates[-1] / 1e3:.1f}k moves/s",
              flush=True)
    ratio = float(np.median(np.array(league_rates) / np.array(pz_rates)))
    print(f"league self-play: {np.median(league_rates) / 1e3:.0f}k moves/s; PettingZoo random loop: "
          f"{np.median(pz_rates) / 1e3:.1f}k moves/s")
    print(f"goal league_selfplay_vs_pettingzoo: {ratio:.1f}x (target {GOAL:.0f}x) {'PASS' if ratio >= GOAL else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
