"""The league's learners on data-parallel DeepSpeed ranks (`learner_backend.ranks: N`).

The league's process is rank 0; `RankGroup` starts ranks 1..N-1 as helper processes on this
machine (gloo on loopback; a multi-machine job would start them with the `deepspeed` launcher and
NCCL instead). A helper holds a replica of every learner, built from the same config and seeds, so
every rank starts from the same weights. `RankedLearner` is what the league sees: it sends each
helper its contiguous share of every batch and runs its own share in this process; the ranks'
`PPOLearner.update(batch, DataShard)` calls together take the update one rank takes on the whole
batch (agents/rl/ppo.py), and DeepSpeed keeps the weights equal on every rank (with ZeRO 1-2 the
optimizer state and gradients are split among them). Everything collective (updates, the full
optimizer state a checkpoint gathers, loading it on resume, a reset) is sent to the helpers and
done here in the same order; freezing a snapshot reads rank 0's weights only.

The helpers are this machine's own processes running our own code on our own tensors (sent over
a pipe, pickled): nothing from outside enters them.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np

from ludus.agents.deepspeed_backend import free_loopback_port, loopback_rank_environment
from ludus.errors import UserError


class RankError(UserError):
    """A helper rank failed; the message has its error."""


def _helper(config, rank: int, world_size: int, port: int, connection) -> None:
    """A helper rank: replicas of the league's learners, driven by the league's process."""
    import torch

    os.environ.update(loopback_rank_environment(rank, world_size, port))
    torch.set_num_threads(1)
    from ludus.games.registry import spec as game_spec
    from ludus.league.learners.base import make_ppo_learner

    spec = game_spec(config.game)
    learners: dict[int, Any] = {}
    while True:
        message = connection.recv()
        kind = message[0]
        try:
            if kind == "close":
                import torch.distributed as dist

                if dist.is_initialized():  # rank 0 keeps its group: the league may carry on in-process
                    dist.destroy_process_group()
                connection.send(("ok", None))
                return
            if kind == "create":
                _, index, seed, init_seed = message
                learners[index] = make_ppo_learner(spec, config, index, seed, init_seed)  # ranks train kind 'ppo' only
            elif kind == "update":
                _, index, batch, shard, progress = message
                learners[index].update(batch, progress, shard=shard)
            elif kind == "state_dict":
                learners[message[1]].state_dict()  # a collective gather: every rank takes part
            elif kind == "load_state_dict":
                learners[message[1]].load_state_dict(message[2])
            elif kind == "reset_to":
                _, index, snapshot, seed = message
                learners[index].reset_to(Path(snapshot), seed)
            else:
                raise ValueError(f"unknown command {kind!r}")
            connection.send(("ok", None))
        except Exception as exc:  # reported to the league's process, which stops with it
            connection.send(("error", f"{type(exc).__name__}: {exc}"))


class RankGroup:
    """Helper ranks 1..N-1 (processes on this machine) of the league's data-parallel learners."""

    def __init__(self, config, world_size: int):
        if world_size < 2:
            raise ValueError("a rank group has at least two ranks")
        self.world_size = world_size
        port = free_loopback_port()
        # This process is rank 0: DeepSpeed reads the rendezvous from the environment.
        os.environ.update(loopback_rank_environment(0, world_size, port))
        context = multiprocessing.get_context("spawn")
        self.connections = []
        self.processes = []
        for rank in range(1, world_size):
            ours, theirs = context.Pipe()
            process = context.Process(target=_helper, args=(config, rank, world_size, port, theirs),
                                      name=f"ludus-rank-{rank}", daemon=True)
            process.start()
            theirs.close()
            self.connections.append(ours)
            self.processes.append(process)

    def send(self, messages: list[tuple]) -> None:
        """One message to each helper (rank 1, 2, ...)."""
        for connection, message in zip(self.connections, messages):
            connection.send(message)

    def wait(self) -> None:
        """Every helper's answer to the last message; a failure stops the league with its error."""
        errors = []
        for rank, connection in enumerate(self.connections, 1):
            try:
                status, detail = connection.recv()
            except EOFError:
                status, detail = "error", "the process died"
            if status != "ok":
                errors.append(f"rank {rank}: {detail}")
        if errors:
            raise RankError(f"a data-parallel learner rank failed ({'; '.join(errors)}); the run stops here and "
                            f"resumes from its last checkpoint")

    def broadcast(self, message: tuple) -> None:
        self.send([message] * len(self.connections))

    def close(self) -> None:
        for connection, process in zip(self.connections, self.processes):
            try:
                connection.send(("close",))
                connection.recv()
            except (OSError, EOFError):
                pass
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
        self.connections, self.processes = [], []


class RankedLearner:
    """A PPO league learner whose updates run on every rank of a `RankGroup` (this process: rank 0)."""

    def __init__(self, group: RankGroup, index: int, seed: int, init_seed: int, make_local):
        self.group = group
        self.index = index
        group.broadcast(("create", index, seed, init_seed))
        self.local = make_local()  # DeepSpeed's rendezvous: returns once every rank has its engine
        group.wait()

    @property
    def module(self):
        return self.local.module

    @property
    def updates(self) -> int:
        return self.local.updates

    @property
    def architecture(self):
        return self.local.architecture

    def update(self, batch, progress: float) -> dict[str, float]:
        from ludus.agents.rl.ppo import DataShard

        n = len(batch)
        world = self.group.world_size
        if n < world:
            raise RankError(f"a batch of {n} rows cannot be split over {world} ranks: play more matches per "
                            f"iteration or use fewer learner_backend.ranks")
        bounds = np.linspace(0, n, world + 1).astype(int)
        shards = [(batch.rows(slice(int(bounds[r]), int(bounds[r + 1]))), DataShard(r, world, int(bounds[r]), n))
                  for r in range(world)]
        self.group.send([("update", self.index, part, shard, progress) for part, shard in shards[1:]])
        stats = self.local.update(shards[0][0], progress, shard=shards[0][1])
        self.group.wait()
        return stats

    def freeze(self, directory: Path, lineage):
        return self.local.freeze(directory, lineage)

    def state_dict(self):
        self.group.broadcast(("state_dict", self.index))
        state = self.local.state_dict()
        self.group.wait()
        return state

    def load_state_dict(self, state) -> None:
        self.group.broadcast(("load_state_dict", self.index, state))
        self.local.load_state_dict(state)
        self.group.wait()

    def reset_to(self, snapshot: Path, seed: int) -> None:
        self.group.broadcast(("reset_to", self.index, str(snapshot), seed))
        self.local.reset_to(snapshot, seed)
        self.group.wait()
