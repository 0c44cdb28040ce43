"""Runners as Ray actors: the league beyond one machine.

`RayBackend` has the interface of `ProcessBackend` (set_population / submit / collect /
restarts / close), and each runner actor runs the very same `Runner.play` as the other backends
with one torch thread, so a seeded sync run records the same ledger on every backend.

What travels through Ray's object store (never through files):

* learner weights: `ray.put` once per (learner, version); tasks carry the ObjectRef and an actor
  fetches it only when it does not hold that version yet;
* the population (frozen members): `ray.put` once per `set_population`;
* frozen members' snapshots: the manager reads a snapshot directory's files once (the first time
  a task needs that member), checks they hash to the member's snapshot id, and puts the bytes in
  the object store; an actor writes them to its own scratch directory and loads them from there
  with `ludus.agents.snapshot.load_snapshot`, which verifies every hash again. Runners on other
  machines therefore need no shared filesystem, and only the manager ever touches the run
  directory (it alone writes the ledger, checkpoints and snapshots).

Every call to an actor carries everything the actor needs (population version, weight refs,
snapshot refs), so a fresh actor can take over any task. Actors are created with
`max_restarts=0`: when one dies (killed, its machine gone) the backend
kills what is left of it, starts a new one and sends it every task of the dead one that was not
collected yet; those tasks are played again from the start, so matches it had not finished are
never recorded (the manager records only returned `PlayResult`s). More than `max_restarts`
deaths stop the run with a one-line error, like `ProcessBackend`; an exception raised by `play`
stops it at once (playing again would raise it again).

The learner stays in the manager process: it is one PPO update per iteration on data that is
already there, and keeping it local keeps checkpoints and resume exactly as in the other
backends. Only runners scale out.

Runners ask for a fraction of a CPU (`runner_cpus`, default 0.5), so a learner and two runners
fit a 2-core machine. Ray's object store pickles what it carries: a Ray cluster is one trust
domain, never join machines you do not control (snapshots from strangers are imported by the
manager through the safe snapshot loader, not through Ray).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

from ludus.games.core import GameSpec
from ludus.league.play.backends import LearnerWeights, PolicyProvider, RunnerCrashLoop, make_runner, runner_error
from ludus.league.learners.base import PolicyArchitecture
from ludus.league.records.population import Member
from ludus.league.play.runner import PlayResult, PlayTask
from ludus.errors import UserError

RUNNER_CPUS = 0.5
"""CPUs each runner actor reserves: two runners and the learner fit a 2-core machine."""
STARTUP_TIMEOUT_S = 120.0
"""How long to wait for the runner actors to be placed and constructed."""
CONNECT_TIMEOUT_S = 10.0
"""How long to wait for the Ray head's port to answer before giving up."""


class RayBackendError(UserError):
    """Ray cannot be started or reached, or cannot place the runners."""


@dataclass(frozen=True)
class SnapshotFiles:
    """A frozen member's snapshot directory as bytes, shipped to runners through the object store."""

    snapshot_id: str
    """Content hash of the snapshot (agents/snapshot.py); the files must hash to it."""
    files: tuple[tuple[str, bytes], ...]
    """(file name, bytes) of every file of the snapshot, manifest.json included."""


def read_snapshot_files(path: str | os.PathLike, expected_id: str) -> SnapshotFiles:
    """The files of the snapshot at `path`, checked to hash to `expected_id`."""
    from ludus.agents.snapshot import (
        MANIFEST_NAME,
        SnapshotError,
        read_manifest,
        sha256_hex,
        snapshot_id_of,
    )

    manifest, manifest_bytes = read_manifest(path)
    files = [(MANIFEST_NAME, manifest_bytes)]
    files += [(name, (Path(path) / name).read_bytes()) for name, _ in manifest.files]
    snapshot_id = snapshot_id_of({name: sha256_hex(data) for name, data in files})
    if snapshot_id != expected_id:
        raise SnapshotError(f"snapshot {path} has id {snapshot_id[:12]}, the population expects "
                            f"{expected_id[:12]}: the directory was modified; restore it from a copy")
    return SnapshotFiles(snapshot_id, tuple(files))


def materialize_snapshot(snapshot: SnapshotFiles, root: Path) -> Path:
    """Write shipped snapshot files under `root/<snapshot_id>` (once) and return that directory."""
    from ludus.agents.snapshot import SnapshotError, sha256_hex, snapshot_id_of

    directory = root / snapshot.snapshot_id
    if directory.is_dir():
        return directory
    if snapshot_id_of({name: sha256_hex(data) for name, data in snapshot.files}) != snapshot.snapshot_id:
        raise SnapshotError(f"shipped snapshot {snapshot.snapshot_id[:12]} does not hash to its id")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    for name, data in snapshot.files:
        (tmp / name).write_bytes(data)
    os.replace(tmp, directory)
    return directory


@dataclass(frozen=True)
class RunnerContext:
    """Everything a runner actor needs besides the task (refs are fetched only when missing)."""

    population_version: int
    """Increases with every `set_population`; an actor holding an older one fetches `population`."""
    population: Any
    """ObjectRef of list[Member] (frozen members as the manager sees them)."""
    weights: tuple[tuple[str, int, Any], ...]
    """(learner player_id, version, ObjectRef of LearnerWeights) of the task's learners."""
    snapshots: tuple[tuple[str, Any], ...]
    """(snapshot_id, ObjectRef of SnapshotFiles) of the frozen members the task's matches use."""


class RunnerActor:
    """A Ray actor wrapping one `Runner` and `PolicyProvider` (`runner_threads` torch threads)."""

    def __init__(self, game_id: str, spec_json: dict, architecture: PolicyArchitecture, num_envs: int,
                 cache_size: int, seed: int, runner_threads: int = 1, inference_dtype: str = "float32",
                 learner_architectures: Mapping[str, PolicyArchitecture] | None = None):
        import torch

        torch.set_num_threads(runner_threads)  # as every backend: thread count changes matmul reduction order
        self.provider = PolicyProvider(GameSpec.from_json(spec_json), architecture, cache_size, inference_dtype,
                                       learner_architectures)
        self.runner = make_runner(game_id, num_envs, seed)
        self.population_version = -1
        self.members: list[Member] = []
        # Shipped snapshots live in this actor's own scratch directory, named by content hash.
        self.scratch = Path(tempfile.mkdtemp(prefix="ludus-runner-"))

    def ready(self) -> tuple[int, str, str]:
        """(process id, Ray node id, scratch directory) of this actor."""
        return os.getpid(), ray.get_runtime_context().get_node_id(), str(self.scratch)

    def remove_scratch_of_dead_runner(self, node_id: str, scratch: str) -> None:
        """Remove the scratch directory a killed runner left on this machine."""
        if node_id == ray.get_runtime_context().get_node_id() and Path(scratch).name.startswith("ludus-runner-"):
            shutil.rmtree(scratch, ignore_errors=True)

    def play(self, task: PlayTask, context: RunnerContext) -> PlayResult:
        if context.population_version != self.population_version:
            self.members = ray.get(context.population)
            self.population_version = context.population_version
            # Frozen members load from the local copies of their shipped snapshots.
            self.provider.set_population([
                replace(m, snapshot_path=str(self.scratch / m.snapshot_id)) if m.kind == "snapshot" else m
                for m in self.members])
        for snapshot_id, ref in context.snapshots:
            if not (self.scratch / snapshot_id).is_dir():
                materialize_snapshot(ray.get(ref), self.scratch)
        for player_id, version, ref in context.weights:
            held = self.provider.learners.get(player_id)
            if held is None or held[0] != version:
                self.provider.set_learner(ray.get(ref))
        return self.runner.play(task, self.provider.policy_of)

    def shutdown(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


@dataclass
class RaySubmission:
    """A submitted batch of tasks: what `submit` returns and `collect` takes."""

    tasks: list[PlayTask]
    """The tasks, in the order their results are returned."""
    contexts: list[RunnerContext]
    """What each task was sent with (a replayed task gets the very same weights and population)."""
    refs: list[Any]
    """ObjectRef of each task's PlayResult (replaced when a task is sent again)."""
    workers: list[int]
    """Runner index of each task."""
    generations: list[int] = field(default_factory=list)
    """Generation of the runner each task went to (a restarted runner has a new generation)."""


class RayBackend:
    """N runner actors on a Ray cluster (local when `address` is None); task i goes to runner i % N."""

    def __init__(self, game_id: str, spec: GameSpec, architecture: PolicyArchitecture, num_envs: int,
                 cache_size: int, num_workers: int, seed: int = 0, address: str | None = None,
                 max_restarts: int = 5, runner_cpus: float = RUNNER_CPUS, runner_threads: int = 1,
                 inference_dtype: str = "float32",
                 learner_architectures: Mapping[str, PolicyArchitecture] | None = None):
        self.args = (game_id, spec.to_json(), architecture, num_envs, cache_size, seed, runner_threads, inference_dtype,
                     learner_architectures)
        self.num_workers = num_workers
        self.max_restarts = max_restarts
        self.runner_cpus = runner_cpus
        self.restarts = 0
        self.population_version = 0
        self.members: dict[str, Member] = {}
        self.population_ref: Any = None
        self.snapshot_refs: dict[str, Any] = {}
        """snapshot_id -> ObjectRef of its SnapshotFiles (snapshots are immutable: put once)."""
        self.weight_refs: dict[str, tuple[int, Any]] = {}
        """Newest (version, ObjectRef) of each learner (in-flight submissions hold older refs)."""
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            _init_ray(address, num_workers, runner_cpus)
        # SPREAD: one runner per node before any node gets a second (Ray's default packs them).
        self.actor_class = ray.remote(RunnerActor).options(num_cpus=runner_cpus, max_restarts=0,
                                                           scheduling_strategy="SPREAD")
        self.generations = [0] * num_workers
        self.actors = [self.actor_class.remote(*self.args) for _ in range(num_workers)]
        self.runners = self._wait_ready(self.actors)
        """(pid, node id, scratch directory) of each runner actor."""
        self.population_ref = ray.put([])

    @property
    def pids(self) -> list[int]:
        """Process id of each runner actor (on its own machine)."""
        return [pid for pid, _, _ in self.runners]

    def _wait_ready(self, actors: list[Any]) -> list[tuple[int, str, str]]:
        try:
            return ray.get([a.ready.remote() for a in actors], timeout=STARTUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            cpus = ray.cluster_resources().get("CPU", 0.0)
            raise RayBackendError(
                f"Ray could not start {len(actors)} runner(s) of {self.runner_cpus} CPU each within "
                f"{STARTUP_TIMEOUT_S:.0f} s (the cluster has {cpus:g} CPUs): add machines or lower num_runners"
            ) from None

    def set_population(self, members: list[Member]) -> None:
        self.members = {m.player_id: m for m in members}
        self.population_version += 1
        self.population_ref = ray.put(list(members))

    def _snapshot_refs(self, task: PlayTask) -> tuple[tuple[str, Any], ...]:
        refs = []
        for player_id in sorted({p for a in task.assignments for p in a.players}):
            member = self.members.get(player_id)
            if member is None or member.kind != "snapshot":
                continue  # a learner (weights travel separately) or an anchor bot
            if member.snapshot_id not in self.snapshot_refs:
                self.snapshot_refs[member.snapshot_id] = ray.put(
                    read_snapshot_files(member.snapshot_path, member.snapshot_id))
            refs.append((member.snapshot_id, self.snapshot_refs[member.snapshot_id]))
        return tuple(refs)

    def submit(self, tasks: list[PlayTask], weights: list[LearnerWeights]) -> RaySubmission:
        for w in weights:
            held = self.weight_refs.get(w.player_id)
            if held is None or held[0] != w.version:
                self.weight_refs[w.player_id] = (w.version, ray.put(w))
        submission = RaySubmission(tasks, [], [], [])
        for i, task in enumerate(tasks):
            weight_refs = []
            for player_id, version in zip(task.learners, task.learner_versions):
                held = self.weight_refs.get(player_id)
                if held is None or held[0] != version:
                    raise ValueError(f"task {task.task_id} needs weights of {player_id!r} version {version}, "
                                     f"which were not submitted")
                weight_refs.append((player_id, version, held[1]))
            context = RunnerContext(self.population_version, self.population_ref, tuple(weight_refs),
                                    self._snapshot_refs(task))
            worker = i % self.num_workers
            submission.contexts.append(context)
            submission.workers.append(worker)
            submission.generations.append(self.generations[worker])
            submission.refs.append(self.actors[worker].play.remote(task, context))
        return submission

    def collect(self, handle: RaySubmission) -> list[PlayResult]:
        results: list[PlayResult | None] = [None] * len(handle.tasks)
        pending = set(range(len(handle.tasks)))
        while pending:
            index_of = {handle.refs[i]: i for i in pending}
            ready, _ = ray.wait(list(index_of), num_returns=1)
            i = index_of[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except ray.exceptions.RayTaskError as error:  # play raised: a bug or bad input, not a crash
                raise runner_error(handle.workers[i], str(error), None) from None
            except ray.exceptions.RayError as error:  # the actor or its node died: restart, replay
                self._restart(handle.workers[i], handle.generations[i], error)
                self._resend(handle, handle.workers[i], pending)
                continue
            pending.discard(i)
        return [r for r in results if r is not None]

    def _restart(self, worker: int, generation: int, error: Exception) -> None:
        if generation != self.generations[worker]:
            return  # already replaced after an earlier failure of the same runner
        self.restarts += 1
        ray.kill(self.actors[worker], no_restart=True)
        if self.restarts > self.max_restarts:
            last = str(error).strip().splitlines()[-1:] or [type(error).__name__]
            raise RunnerCrashLoop(f"Ray runners died {self.restarts} times (last: {last[0]})")
        self.generations[worker] += 1
        self.actors[worker] = self.actor_class.remote(*self.args)
        _, dead_node, dead_scratch = self.runners[worker]
        self.runners[worker] = self._wait_ready([self.actors[worker]])[0]
        # The dead actor could not clean up; its successor does, if it runs on the same machine.
        self.actors[worker].remove_scratch_of_dead_runner.remote(dead_node, dead_scratch)

    def _resend(self, handle: RaySubmission, worker: int, pending: set[int]) -> None:
        """Send the uncollected tasks of `worker` to its current actor, in their order."""
        for j in sorted(pending):
            if handle.workers[j] == worker and handle.generations[j] != self.generations[worker]:
                handle.generations[j] = self.generations[worker]
                handle.refs[j] = self.actors[worker].play.remote(handle.tasks[j], handle.contexts[j])

    def close(self) -> None:
        try:
            ray.get([a.shutdown.remote() for a in self.actors], timeout=10)
        except ray.exceptions.RayError:
            pass  # a dead actor has no scratch directory left to remove on a live machine
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.owns_ray:
            ray.shutdown()


def _init_ray(address: str | None, num_workers: int, runner_cpus: float) -> None:
    """Start a local Ray (address None) or connect to a running cluster."""
    if address is None:
        # Logical CPUs: at least the machine's cores, and enough for every runner's share, so a
        # local run never waits for CPUs that will not come (the OS shares the real cores).
        num_cpus = max(os.cpu_count() or 1, math.ceil(num_workers * runner_cpus))
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a private, local Ray reports nothing
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        return
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        # Ray keeps retrying an unreachable head for minutes; one TCP connect tells at once.
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise RayBackendError(f"no Ray head answers at {address} ({exc.strerror or exc}); start one with "
                                  f"`ray start --head --port={port}` on that machine") from None
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as exc:
        raise RayBackendError(f"cannot connect to the Ray cluster at {address!r} ({str(exc).splitlines()[0]}); "
                              f"if its head uses token authentication, export RAY_AUTH_MODE=token here and give "
                              f"this machine the head's ~/.ray/auth_token (docs/scale_out.md)") from None

