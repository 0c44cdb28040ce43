"""What makes a run directory one consistent unit, whatever moment a kill -9 hits.

A checkpoint (``checkpoints/iter-N/``, named by ``checkpoint.json``) holds everything a resume
needs. Beside the learners' weights and the league's state it records:

* **the ledger position** (`LedgerMark`: rows up to the checkpoint's seq, and the id and seed of the
  row at that seq). Rows beyond it belong to an iteration that was interrupted; resume plays that
  iteration again, identically, and does not append them twice. A ledger that is missing, empty,
  shorter, or another run's does not match the mark, and resume refuses it.
* **the config digest** (of everything but `iterations`, which `resume --iterations` may raise).
* **the plan in flight** in asynchronous mode (`pipeline_depth: 2`): iteration i+1 is planned and
  handed to the runners before iteration i learns and checkpoints, with the weights of before that
  update. The checkpoint keeps those tasks and those weights (`PendingPlay`), so a resume
  resubmits exactly what the uninterrupted run played, instead of planning i+1 a second time from
  a later state.

Temporary directories that a kill leaves behind (a checkpoint or snapshot being written, a run
being created) are removed by `clean_stale_temporaries`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from league.backends import LearnerWeights
from league.ledger import Store
from league.runner import MatchAssignment, PlayTask
from ludus.errors import UserError

PENDING_FILE = "pending.json"
CREATING_PREFIX = ".creating-"
"""A run being created lives in ``<parent>/.creating-<name>-<pid>`` until its first checkpoint."""


class RunError(UserError):
    """A run directory cannot be created or resumed."""


@dataclass(frozen=True)
class LedgerMark:
    """Where the ledger stood when a checkpoint was written."""

    last_seq: int
    """The seq of the newest row (0: empty)."""
    matches: int
    """Rows with seq <= last_seq."""
    tail: tuple[int, int] | None
    """(match_id, seed) of the row at last_seq; None for an empty ledger."""

    def to_json(self) -> dict[str, Any]:
        return {"last_seq": self.last_seq, "matches": self.matches, "tail": list(self.tail) if self.tail else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LedgerMark":
        tail = data["tail"]
        return cls(int(data["last_seq"]), int(data["matches"]), (int(tail[0]), int(tail[1])) if tail else None)


def ledger_mark(store: Store, up_to_seq: int | None = None) -> LedgerMark:
    seq = store.last_seq() if up_to_seq is None else up_to_seq
    return LedgerMark(seq, store.count_matches_up_to(seq), store.match_at_seq(seq))


def check_ledger(store: Store, mark: LedgerMark, run_dir: Path) -> None:
    """Refuse a ledger that is not the one the checkpoint was written against."""
    found = ledger_mark(store, mark.last_seq)
    if found != mark or store.last_seq() < mark.last_seq:
        raise RunError(f"{run_dir}: the ledger does not match the checkpoint (checkpoint: {mark.matches} matches up to "
                       f"seq {mark.last_seq}; ledger: {store.count_matches()} matches, newest seq {store.last_seq()}); "
                       f"was ledger.sqlite replaced, emptied or deleted? Restore it, or start a new run")


def config_digest(config: dict[str, Any]) -> str:
    """sha256 of the run's config, less `iterations` (which `resume --iterations` may raise)."""
    rest = {k: v for k, v in config.items() if k != "iterations"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class PendingPlay:
    """Tasks already handed to the runners for the next iteration, and the weights they were sent
    with (asynchronous mode)."""

    tasks: tuple[PlayTask, ...]
    weights: tuple[LearnerWeights, ...]

    def save(self, directory: Path) -> None:
        from safetensors.numpy import save_file

        weights = []
        for w in self.weights:
            name = f"pending-weights-{w.player_id}.safetensors"
            save_file({k: np.ascontiguousarray(v) for k, v in w.arrays.items()}, str(directory / name))
            weights.append({"player_id": w.player_id, "version": w.version, "file": name})
        tasks = [dataclasses.asdict(t) for t in self.tasks]
        (directory / PENDING_FILE).write_text(json.dumps({"tasks": tasks, "weights": weights}))

    @classmethod
    def load(cls, directory: Path) -> "PendingPlay | None":
        from safetensors.numpy import load_file

        path = directory / PENDING_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        tasks = []
        for t in data["tasks"]:
            assignments = tuple(MatchAssignment(a["match_id"], a["seed"], tuple(a["players"]), a["kind"])
                                for a in t["assignments"])
            fields = {k: tuple(v) if isinstance(v, list) else v for k, v in t.items() if k != "assignments"}
            tasks.append(PlayTask(assignments=assignments, **fields))
        weights = tuple(LearnerWeights(w["player_id"], int(w["version"]), load_file(str(directory / w["file"])))
                        for w in data["weights"])
        return cls(tuple(tasks), weights)


def clean_stale_temporaries(run_dir: Path) -> list[Path]:
    """Remove what a kill left half-written: ``checkpoints/.tmp-*`` and snapshot temporaries."""
    removed = []
    # agents/snapshot.py writes a snapshot as snapshots/.<name>.tmp-XXXX, then renames it
    for pattern in ("checkpoints/.tmp-*", "snapshots/.*.tmp-*"):
        for path in run_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def clean_stale_creations(parent: Path) -> list[Path]:
    """Remove runs whose creation was killed (``.creating-*`` whose process is gone)."""
    removed = []
    for path in parent.glob(f"{CREATING_PREFIX}*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
