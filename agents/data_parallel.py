"""Data-parallel PPO on DeepSpeed: N processes, each with 1/N of a batch, take one update together.

`PPOLearner.update(batch, shard)` (agents/rl/ppo.py) holds the arithmetic that makes N ranks equal
one process: the same permutation of the global rows on every rank, global advantage moments,
and losses scaled so that DeepSpeed's average of the ranks' gradients is the gradient of each whole
minibatch. This module runs it: `run_ranks` starts N processes (gloo on loopback here; the same
code runs under the `deepspeed` launcher with NCCL on GPUs), each a DeepSpeed engine over the same
initial net with ZeRO stage 0-2 (stages 1 and 2 partition the optimizer state and gradients
across the ranks), gives each its contiguous shard of the batch, and returns the weights after
`updates` updates, which every rank holds identically.

    python -m ludus.agents.data_parallel --world-size 2 --zero-stage 1      # prints max |2 ranks - 1 rank|

`tests/test_deepspeed.py` checks the equivalence; `benchmarks/deepspeed_ranks.py` times it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GAME = "tic_tac_toe"


@dataclass(frozen=True)
class RankRun:
    """What one data-parallel job returned."""

    weights: dict[str, np.ndarray]
    """The net's parameters after the updates (rank 0's; every rank checked equal)."""
    seconds: float
    """Wall time of the updates (rank 0), without start-up."""


def synthetic_batch(seed: int, rows: int):
    """A PPO batch on tic-tac-toe observations in which every parameter gets a gradient."""
    from ludus.agents.rollout import RolloutBatch
    from ludus.games.registry import spec as game_spec

    spec = game_spec(GAME)
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((rows, *spec.observation_shape)).astype(np.float32)
    mask = rng.random((rows, spec.num_actions)) < 0.6
    mask[:, 0] = True
    actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
    return RolloutBatch(obs=obs, mask=mask, actions=actions, logprobs=np.full(rows, -1.5, np.float32),
                        values=rng.standard_normal(rows).astype(np.float32), rewards=np.zeros(rows, np.float32),
                        dones=np.zeros(rows, bool), advantages=rng.standard_normal(rows).astype(np.float32),
                        returns=rng.standard_normal(rows).astype(np.float32),
                        policy_version=np.zeros(rows, np.int64), slots=np.zeros(rows, np.int64),
                        seats=np.zeros(rows, np.int64))


def _rank_main(args: argparse.Namespace) -> None:
    """One rank: build the net and engine, update on this rank's shard, write the weights."""
    import torch
    import torch.distributed as dist

    from ludus.agents.deepspeed_backend import LearnerBackendConfig, make_update_backend
    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.rl.ppo import DataShard, PPOConfig, PPOLearner
    from ludus.games.registry import spec as game_spec
    from safetensors.numpy import save_file

    torch.set_num_threads(1)
    ppo = PPOConfig(minibatch_size=args.minibatch, update_epochs=args.epochs)
    torch.manual_seed(0)
    net = ActorCritic(game_spec(GAME), NetConfig(hidden=(64, 64)))
    backend = make_update_backend(net, ppo, LearnerBackendConfig(backend="deepspeed", zero_stage=args.zero_stage))
    learner = PPOLearner(net, ppo, seed=1, backend=backend)
    bounds = np.linspace(0, args.rows, args.world_size + 1).astype(int)
    start, stop = int(bounds[args.rank]), int(bounds[args.rank + 1])
    shard = DataShard(args.rank, args.world_size, start, args.rows) if args.world_size > 1 else None
    batches = [synthetic_batch(seed, args.rows).rows(slice(start, stop)) for seed in range(args.updates)]
    begun = time.perf_counter()
    for batch in batches:
        learner.update(batch, shard)
    seconds = time.perf_counter() - begun
    weights = {name: p.detach().float().numpy().copy() for name, p in net.named_parameters()}
    if args.world_size > 1:  # every rank must hold the same weights
        flat = torch.cat([torch.from_numpy(w).flatten() for w in weights.values()]).double()
        lowest, highest = flat.clone(), flat.clone()
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        if not torch.equal(lowest, highest):
            raise SystemExit(f"rank {args.rank}: the ranks' weights differ after the update")
    if args.rank == 0:
        save_file(weights, args.out)
        Path(args.out + ".json").write_text(json.dumps({"seconds": seconds}))
    if dist.is_initialized():  # leave together: a rank exiting while gloo still talks to it aborts
        dist.barrier()
        dist.destroy_process_group()


def run_ranks(world_size: int, zero_stage: int = 1, rows: int = 512, minibatch: int = 128, epochs: int = 2,
              updates: int = 1, timeout: float = 600.0) -> RankRun:
    """Run `world_size` ranks (processes on loopback) through `updates` PPO updates of a synthetic
    batch of `rows` rows split evenly among them; rank 0's weights and time."""
    from safetensors.numpy import load_file

    from ludus.agents.deepspeed_backend import free_loopback_port, loopback_rank_environment

    with tempfile.TemporaryDirectory(prefix="ludus-ranks-") as tmp:
        out = os.path.join(tmp, "weights.safetensors")
        port = free_loopback_port()
        processes = []
        for rank in range(world_size):
            env = dict(os.environ, **loopback_rank_environment(rank, world_size, port), OMP_NUM_THREADS="1")
            command = [sys.executable, "-m", "ludus.agents.data_parallel", "--rank", str(rank), "--world-size",
                       str(world_size), "--zero-stage", str(zero_stage), "--rows", str(rows), "--minibatch",
                       str(minibatch), "--epochs", str(epochs), "--updates", str(updates), "--out", out]
            processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, cwd=str(Path(__file__).resolve().parents[1])))
        failed = []
        for rank, process in enumerate(processes):
            try:
                _, err = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in processes:
                    p.kill()
                raise RuntimeError(f"rank {rank} did not finish within {timeout:.0f} s") from None
            if process.returncode != 0:
                failed.append(f"rank {rank} exited {process.returncode}: {err.strip().splitlines()[-1:]}")
        if failed:
            raise RuntimeError("; ".join(failed))
        weights = load_file(out)
        seconds = json.loads(Path(out + ".json").read_text())["seconds"]
    return RankRun(weights, seconds)


def max_difference(a: RankRun, b: RankRun) -> float:
    return max(float(np.abs(a.weights[k] - b.weights[k]).max()) for k in a.weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--zero-stage", type=int, default=1)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--minibatch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--updates", type=int, default=1)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        _rank_main(args)
        return 0
    settings = dict(zero_stage=args.zero_stage, rows=args.rows, minibatch=args.minibatch, epochs=args.epochs,
                    updates=args.updates)
    many, one = run_ranks(args.world_size, **settings), run_ranks(1, **settings)
    print(f"max |{args.world_size} ranks - 1 rank| = {max_difference(many, one):.3g} "
          f"({many.seconds:.2f} s vs {one.seconds:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
