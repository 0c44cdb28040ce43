"""Conformance checkers of the league's seams (next to games/check.py and agents/check.py).

* `check_learner(config)`: a learner restored from its own `state_dict` (through safetensors
  bytes, as a checkpoint stores it) takes exactly the next update the original takes: same
  weights, same statistics. This is what exact resume rests on.
* `check_backend(config, backend)`: a short seeded league run on `backend` writes the same ledger
  rows, ratings history and snapshot bytes as the same run on the serial backend. This is what
  "serial, processes or Ray: the same results" rests on.

Both build what they need from a `LeagueConfig`, so every preset and every learner kind can be
checked the same way (tests/test_checkers.py runs them over all of them).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ludus.agents.rollout import RolloutBatch
from ludus.agents.threads import torch_threads
from ludus.games.registry import spec as game_spec
from ludus.league.play.backends import SerialBackend
from ludus.league.config import LeagueConfig
from ludus.league.learners.base import LeagueLearner, module_weights
from ludus.league.learners.learning import make_learner
from ludus.league.play.runner import LearnerWeights, MatchAssignment, PlayTask
from ludus.league.seeds import match_seed


class LearnerCheckError(AssertionError):
    """A learner does not resume exactly; the message says what differed."""


class BackendCheckError(AssertionError):
    """A backend's run differs from the serial backend's; the message says what differed."""


def self_play_batches(learner: LeagueLearner, config: LeagueConfig, count: int, matches: int = 8,
                      seed: int = 0) -> list[RolloutBatch]:
    """`count` batches of the learner's own trajectories from seeded self-play on the serial backend
    (the learner plays every seat, its weights as they are now)."""
    spec = game_spec(config.game)
    backend = SerialBackend(config.game, spec, learner.architecture, num_envs=min(config.num_envs, matches),
                            cache_size=1, seed=seed)
    backend.set_population([])
    weights = [LearnerWeights("main", learner.updates, module_weights(learner.module))]
    batches = []
    for index in range(count):
        first = index * matches
        task = PlayTask(task_id=index, sample_seed=seed * 1000 + index, learners=("main",),
                        learner_versions=(learner.updates,), gamma=config.ppo.gamma, gae_lambda=config.ppo.gae_lambda,
                        assignments=tuple(MatchAssignment(first + j, match_seed(seed, first + j),
                                                          ("main",) * spec.num_players, "training")
                                          for j in range(matches)))
        (result,) = backend.collect(backend.submit([task], weights))
        batches.append(result.rollouts["main"])
    backend.close()
    return batches


@dataclass(frozen=True)
class LearnerCheckReport:
    learner: str
    tensors: int
    """Named tensors in the learner's state."""
    rows: int
    """Rows of the update compared."""


def check_learner(config: LeagueConfig, seed: int = 0) -> LearnerCheckReport:
    """Update a learner once, save it, restore the save into a fresh learner, then give both the
    same second batch: the two must end with identical state and report identical statistics."""
    from safetensors.torch import load as load_bytes
    from safetensors.torch import save as save_bytes

    spec = game_spec(config.game)
    with torch_threads(1):  # the caller's count is restored after: the check runs inside tests and the CLI
        original = make_learner(spec, config, 0, seed=seed, init_seed=seed + 1)
        first, second = self_play_batches(original, config, 2, seed=seed)
        original.update(first, progress=0.0)
        saved = save_bytes({k: v.contiguous() for k, v in original.state_dict().items()})
        # other seeds: all must come from the save
        restored = make_learner(spec, config, 0, seed=seed + 2, init_seed=seed + 3)
        restored.load_state_dict(load_bytes(saved))
        stats = [learner.update(second, progress=0.5) for learner in (original, restored)]
    if not _same_numbers(stats[0], stats[1]):
        raise LearnerCheckError(f"learner {config.learner!r}: the restored learner's update reported {stats[1]}, "
                                f"the original's {stats[0]}")
    states = [learner.state_dict() for learner in (original, restored)]
    if states[0].keys() != states[1].keys():
        raise LearnerCheckError(f"learner {config.learner!r}: state keys differ after the update: "
                                f"{sorted(states[0].keys() ^ states[1].keys())[:5]}")
    for key in states[0]:
        if not torch.equal(states[0][key], states[1][key]):
            raise LearnerCheckError(f"learner {config.learner!r}: {key} differs after the same update "
                                    f"on the restored learner")
    if original.updates != restored.updates:
        raise LearnerCheckError(f"learner {config.learner!r}: versions {original.updates} vs {restored.updates}")
    return LearnerCheckReport(config.learner, len(states[0]), len(second))


def _same_numbers(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(x == y or (np.isnan(x) and np.isnan(y)) for x, y in
                                        ((a[k], b[k]) for k in a))


@dataclass(frozen=True)
class BackendCheckReport:
    backend: str
    matches: int
    snapshots: int


def run_fingerprint(run_dir: Path) -> tuple[list[tuple], dict[str, str]]:
    """A finished run's ledger (without wall-clock fields, with the ratings history) and the
    hashes of its snapshot manifests (which hash every snapshot file)."""
    from ludus.league.records.ledger import Store

    with Store.open(run_dir, mode="read") as store:
        rows = store.comparable_rows()
    snapshots = {m.parent.name: hashlib.sha256(m.read_bytes()).hexdigest()
                 for m in sorted((run_dir / "snapshots").glob("*/manifest.json"))}
    return rows, snapshots


def resumed_fingerprint(config: LeagueConfig, run_dir: Path, stop_after: int = 1) -> tuple[list[tuple], dict[str, str]]:
    """The `run_fingerprint` of a run of `config` stopped at iteration `stop_after` (closed at the
    boundary, as a kill would leave it) and resumed to the end: equal to the fingerprint of the
    run trained through when resume is exact."""
    from ludus.league.api import League

    half = League.create(config, run_dir)
    try:
        half.run(until_iteration=stop_after)
    finally:
        half.close()
    resumed = League.resume(run_dir)
    try:
        resumed.run()
    finally:
        resumed.close()
    return run_fingerprint(run_dir)


def check_backend(config: LeagueConfig, backend: str, workdir: str | None = None) -> BackendCheckReport:
    """Run `config` on the serial backend and on `backend`; the ledgers and snapshots must match."""
    from ludus.league.manager import League

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        prints = {}
        for name in ("serial", backend):
            league = League.create(replace(config, backend=name), Path(tmp) / name)
            try:
                league.run()
            finally:
                league.close()
            prints[name] = run_fingerprint(Path(tmp) / name)
    (rows, snaps), (other_rows, other_snaps) = prints["serial"], prints[backend]
    if snaps != other_snaps:
        differ = sorted(k for k in snaps.keys() | other_snaps.keys() if snaps.get(k) != other_snaps.get(k))
        raise BackendCheckError(f"backend {backend!r}: snapshots {differ[:3]} differ from the serial run's")
    if rows != other_rows:
        where = next((i for i, (a, b) in enumerate(zip(rows, other_rows)) if a != b), min(len(rows), len(other_rows)))
        raise BackendCheckError(f"backend {backend!r}: the ledger differs from the serial run's at row {where} "
                                f"({len(other_rows)} rows vs {len(rows)})")
    return BackendCheckReport(backend, len(rows), len(snaps))
