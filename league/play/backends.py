"""Where runners run: in this process (serial), in worker processes, or on Ray.

Every backend runs `Runner.play` — the same pure compute — on `PlayTask`s, and takes the
learners' weights as plain arrays tagged with a policy version. The manager drives them all
through `submit(tasks, weights) -> handle` and `collect(handle) -> [PlayResult]`, in task order,
so a seeded sync run gives the same results on every backend.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any, Protocol


from ludus.agents.policy import Policy
from ludus.agents.threads import torch_threads
from ludus.games.core import GameSpec
from ludus.league.learners.base import PolicyArchitecture
from ludus.league.records.population import Member, PolicyCache, load_member_policy
from ludus.league.play.runner import LearnerWeights, PlayResult, PlayTask, Runner, gc_paused
from ludus.errors import UserError



class RunnerCrashLoop(UserError):
    """Runners keep dying (killed, out of memory): restarting them did not help."""


class RunnerError(UserError):
    """A runner raised an exception: a bug or bad input, which playing again would only repeat.
    The message is its last line; the whole traceback is in the runner's log."""


def runner_error(index: int, trace: str, log_path: str | None) -> RunnerError:
    last = next((line for line in reversed(trace.strip().splitlines()) if line.strip()), "unknown error")
    where = f"; the traceback is in {log_path}" if log_path else ""
    return RunnerError(f"runner {index} failed: {last.strip()}{where}")


class PolicyProvider:
    """player_id -> Policy for a runner: live learners from shipped weights, frozen members via an LRU cache.

    `inference_dtype` 'bfloat16': actor-critic nets (learners' and snapshots', MAPPO sides' actors)
    act in bfloat16 (`ludus.agents.torch_policy.TorchPolicy`); other policies are unchanged.
    `learner_architectures`: the learners whose architecture is not `architecture` (a role with its
    own `net`), by player id."""

    def __init__(self, spec: GameSpec, architecture: PolicyArchitecture, cache_size: int,
                 inference_dtype: str = "float32",
                 learner_architectures: Mapping[str, PolicyArchitecture] | None = None):
        self.spec = spec
        self.architecture = architecture
        self.learner_architectures = dict(learner_architectures or {})
        self.inference_dtype = inference_dtype
        self.members: dict[str, Member] = {}
        self.cache = PolicyCache(lambda pid: self._acting(load_member_policy(self.members[pid], spec,
                                                                             architecture.lm_base)), cache_size)
        self.learners: dict[str, tuple[int, Policy]] = {}

    def _acting(self, policy: Policy) -> Policy:
        from ludus.agents.rl.mappo import CentralisedCriticPolicy
        from ludus.agents.lm.pretrained import DTYPES
        from ludus.agents.torch_policy import TorchPolicy

        if isinstance(policy, (TorchPolicy, CentralisedCriticPolicy)):
            policy.dtype = DTYPES[self.inference_dtype]
        return policy

    def set_population(self, members: list[Member]) -> None:
        self.members = {m.player_id: m for m in members}

    def set_learner(self, weights: LearnerWeights) -> None:
        import torch

        current = self.learners.get(weights.player_id)
        if current is not None and current[0] == weights.version:
            return
        if current is not None:
            module, policy = current[1]
        else:
            architecture = self.learner_architectures.get(weights.player_id, self.architecture)
            module, policy = architecture.build(self.spec)
            self._acting(policy)
        module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.arrays.items()})
        module.eval()
        self.learners[weights.player_id] = (weights.version, (module, policy))

    def policy_of(self, player_id: str) -> Policy:
        if player_id in self.learners:
            return self.learners[player_id][1][1]
        if player_id not in self.members:
            raise KeyError(f"player {player_id!r} is neither a learner nor in the population")
        return self.cache.get(player_id)


def make_runner(game_id: str, num_envs: int, seed: int) -> Runner:
    from ludus.games.registry import make_vector

    return Runner(lambda n: make_vector(game_id, n, seed=seed), num_envs)


class Backend(Protocol):
    def set_population(self, members: list[Member]) -> None: ...

    def submit(self, tasks: list[PlayTask], weights: list[LearnerWeights]) -> Any: ...

    def collect(self, handle: Any) -> list[PlayResult]: ...

    @property
    def restarts(self) -> int: ...

    def close(self) -> None: ...


class SerialBackend:
    """Runs tasks in this process, one after another, at submit time."""

    def __init__(self, game_id: str, spec: GameSpec, architecture: PolicyArchitecture, num_envs: int,
                 cache_size: int, seed: int = 0, runner_threads: int = 1, inference_dtype: str = "float32",
                 learner_architectures: Mapping[str, PolicyArchitecture] | None = None):
        self.provider = PolicyProvider(spec, architecture, cache_size, inference_dtype, learner_architectures)
        self.runner = make_runner(game_id, num_envs, seed)
        self.runner_threads = runner_threads
        self.restarts = 0

    def set_population(self, members: list[Member]) -> None:
        self.provider.set_population(members)

    def submit(self, tasks: list[PlayTask], weights: list[LearnerWeights]) -> list[PlayResult]:
        for w in weights:
            self.provider.set_learner(w)
        # as the workers, which run `runner_threads` torch threads each: the same floats either way
        with torch_threads(self.runner_threads):
            return [self.runner.play(task, self.provider.policy_of) for task in tasks]

    def collect(self, handle: list[PlayResult]) -> list[PlayResult]:
        return handle

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Worker processes


def _worker_main(conn, game_id: str, spec_json: dict, architecture: PolicyArchitecture, num_envs: int,
                 cache_size: int, seed: int, runner_threads: int, inference_dtype: str,
                 learner_architectures: Mapping[str, PolicyArchitecture] | None, log_path: str | None) -> None:
    """A runner process: receives population/weights/tasks, sends PlayResults or a traceback."""
    import torch

    torch.set_num_threads(runner_threads)
    if log_path:
        log = open(log_path, "a", buffering=1)
        os.dup2(log.fileno(), 2)
    spec = GameSpec.from_json(spec_json)
    provider = PolicyProvider(spec, architecture, cache_size, inference_dtype, learner_architectures)
    runner = make_runner(game_id, num_envs, seed)
    while True:
        try:
            with gc_paused():  # a task unpickles a record per match
                message = conn.recv()
        except EOFError:
            return
        kind = message[0]
        if kind == "stop":
            return
        try:
            if kind == "population":
                provider.set_population(message[1])
            elif kind == "weights":
                provider.set_learner(message[1])
            elif kind == "task":
                result = runner.play(message[1], provider.policy_of)
                with gc_paused():  # pickling it
                    conn.send(("result", result))
        except Exception:  # the manager stops the run with the last line; the log keeps the rest
            trace = traceback.format_exc()
            if log_path:
                sys.stderr.write(trace)
                sys.stderr.flush()
            conn.send(("error", trace))
            return


class ProcessBackend:
    """N runner processes (`runner_threads` torch threads each); task i goes to worker i % N.

    A worker that dies (killed, out of memory, a broken pipe at any moment) is restarted and its
    tasks are played again from the start, so matches it had not finished are never recorded; more
    than `max_restarts` deaths stop the run with a one-line `RunnerCrashLoop`. A worker that raises
    an exception stops the run at once with a one-line `RunnerError` (playing the same task again
    would raise it again); the traceback is in its log.
    """

    def __init__(self, game_id: str, spec: GameSpec, architecture: PolicyArchitecture, num_envs: int,
                 cache_size: int, num_workers: int, seed: int = 0, log_dir: str | None = None,
                 max_restarts: int = 5, runner_threads: int = 1, inference_dtype: str = "float32",
                 learner_architectures: Mapping[str, PolicyArchitecture] | None = None):
        self.args = (game_id, spec.to_json(), architecture, num_envs, cache_size, seed, runner_threads, inference_dtype,
                     learner_architectures)
        self.num_workers = num_workers
        self.log_dir = log_dir
        self.max_restarts = max_restarts
        self.restarts = 0
        self.context = mp.get_context("spawn")
        self.population: list[Member] = []
        self.weights: dict[str, LearnerWeights] = {}
        # Weights by (player, version) for tasks in flight: a restarted worker replays each task
        # with the very weights it was submitted with.
        self.weight_history: dict[tuple[str, int], LearnerWeights] = {}
        self.workers: list[tuple[Any, Any]] = [self._start(i) for i in range(num_workers)]

    def _start(self, index: int) -> tuple[Any, Any]:
        parent, child = self.context.Pipe()
        log_path = self._log_path(index)
        process = self.context.Process(target=_worker_main, args=(child, *self.args, log_path),
                                       name=f"ludus-runner-{index}", daemon=True)
        process.start()
        child.close()
        if self.population:
            parent.send(("population", self.population))
        for w in self.weights.values():
            parent.send(("weights", w))
        return process, parent

    def _send(self, index: int, message: tuple) -> None:
        """Send to worker `index`; a worker found dead is restarted (it gets the population and
        weights on start) and a task is sent to its successor."""
        try:
            self.workers[index][1].send(message)
        except (BrokenPipeError, ConnectionError, OSError):
            self._restart(index, f"runner {index} died (exit code {self.workers[index][0].exitcode})")
            if message[0] == "task":
                self.workers[index][1].send(message)

    def set_population(self, members: list[Member]) -> None:
        self.population = list(members)
        for index in range(self.num_workers):
            self._send(index, ("population", self.population))

    def submit(self, tasks: list[PlayTask], weights: list[LearnerWeights]) -> list[PlayTask]:
        for w in weights:
            self.weights[w.player_id] = w
            self.weight_history[(w.player_id, w.version)] = w
            for index in range(self.num_workers):
                self._send(index, ("weights", w))
        for i, task in enumerate(tasks):
            self._send(i % self.num_workers, ("task", task))
        return tasks

    def _log_path(self, index: int) -> str | None:
        return os.path.join(self.log_dir, f"runner-{index}.log") if self.log_dir else None

    def _restart(self, index: int, reason: str) -> None:
        self.restarts += 1
        process, conn = self.workers[index]
        conn.close()
        if process.is_alive():
            process.kill()
        process.join(timeout=10)
        if self.restarts > self.max_restarts:
            raise RunnerCrashLoop(f"runner processes died {self.restarts} times (last: {reason}); is the machine out "
                                  f"of memory? See {self._log_path(index) or 'the runner logs'}")
        self.workers[index] = self._start(index)

    def collect(self, handle: list[PlayTask]) -> list[PlayResult]:
        results: list[PlayResult | None] = [None] * len(handle)
        pending = {i: t for i, t in enumerate(handle)}
        while pending:
            for i in sorted(pending):
                worker = i % self.num_workers
                process, conn = self.workers[worker]
                # A worker answers its tasks in the order it got them, so wait for the first
                # pending task of this worker before any later one.
                if any(j < i and j % self.num_workers == worker for j in pending):
                    continue
                try:
                    while not conn.poll(0.2):
                        if not process.is_alive():
                            raise EOFError
                    with gc_paused():
                        kind, payload = conn.recv()
                except (EOFError, OSError):
                    code = process.exitcode
                    self._restart(worker, f"runner {worker} exited with code {code} (no traceback: killed?)")
                    self._resend(worker, pending)
                    break
                if kind == "error":
                    raise runner_error(worker, payload, self._log_path(worker))
                results[i] = payload
                del pending[i]
        # Keep only the newest weights of each learner (older tasks are all collected now).
        newest = {(w.player_id, w.version) for w in self.weights.values()}
        self.weight_history = {k: v for k, v in self.weight_history.items() if k in newest}
        return [r for r in results if r is not None]

    def _resend(self, worker: int, pending: dict[int, PlayTask]) -> None:
        for j in sorted(pending):
            if j % self.num_workers == worker:
                task = pending[j]
                for key in zip(task.learners, task.learner_versions):
                    if key in self.weight_history:
                        self._send(worker, ("weights", self.weight_history[key]))
                self._send(worker, ("task", task))

    def close(self) -> None:
        for process, conn in self.workers:
            try:
                conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        # A worker still importing torch reads "stop" only after its imports: give it a moment, then kill.
        deadline = time.monotonic() + 3
        for process, conn in self.workers:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()
