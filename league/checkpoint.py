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

The state itself crosses into and out of the loop as typed records (`CheckpointState`,
`LearnerState`); `write_checkpoint` and `read_checkpoint` are the only code that knows the files.

Temporary directories that a kill leaves behind (a checkpoint or snapshot being written, a run
being created) are removed by `clean_stale_temporaries`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

from ludus.league.records.ledger import LEDGER_FILENAME, Store
from ludus.league.records.population import Population
from ludus.league.play.runner import LearnerWeights, MatchAssignment, PlayTask
from ludus.errors import UserError
from ludus.files import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:  # ludus.league.config imports the learners' configs and with them torch; readers need neither
    from ludus.league.config import LeagueConfig

CHECKPOINT_POINTER = "checkpoint.json"
"""Names the newest complete checkpoint directory (rewritten atomically after it is complete)."""
CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
FORMAT_VERSION = 2
"""2: the checkpoint records the ledger position, the config digest and the plan in flight."""
KEEP_CHECKPOINTS = 2
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
    """sha256 of the run's config, less `iterations` (which `resume --iterations` may raise) and an
    empty `game_module` (a key added later: runs written before it still resume)."""
    rest = {k: v for k, v in config.items() if k != "iterations" and not (k == "game_module" and not v)}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class LearnerState:
    """A live learner's league bookkeeping (its weights and optimizer are saved beside it)."""

    steps: int = 0
    """Env steps (own decisions) trained on."""
    steps_at_snapshot: int = 0
    snapshots: int = 0
    resets: int = 0
    last_snapshot: str | None = None
    """player_id of its latest snapshot."""
    window: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """(wins, draws, games) against the pool since the last snapshot."""
    dropped_stale: int = 0
    """Rows never trained on because they were older than `max_policy_lag`."""
    returns: tuple[float, float] = (0.0, 0.0)
    """(sum of episode returns, games) of its training games against the pool in this iteration."""
    gain: tuple[float, float, int] | None = None
    """(smoothed mean return, best smoothed mean return, iterations without a new best) since its
    last snapshot: the plateau rule's state (`ludus.league.learners.learning.track_gain`); None before any game."""

    def replace(self, **changes: Any) -> "LearnerState":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "window": list(self.window), "returns": list(self.returns),
                "gain": None if self.gain is None else list(self.gain)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LearnerState":
        return cls(steps=int(data["steps"]), steps_at_snapshot=int(data["steps_at_snapshot"]),
                   snapshots=int(data["snapshots"]), resets=int(data["resets"]), last_snapshot=data["last_snapshot"],
                   window=tuple(float(x) for x in data["window"]), dropped_stale=int(data["dropped_stale"]),
                   returns=tuple(float(x) for x in data.get("returns", (0.0, 0.0))),
                   gain=None if data.get("gain") is None else (float(data["gain"][0]), float(data["gain"][1]),
                                                               int(data["gain"][2])))


@dataclass(frozen=True)
class CheckpointState:
    """Everything but tensors that a resume needs (``state.json``)."""

    iteration: int
    """Iterations completed."""
    next_match_id: int
    total_env_steps: int
    total_matches: int
    ledger: LedgerMark
    config_digest: str
    rng: dict[str, Any]
    """The matchmaking generator's bit-generator state."""
    population: Population
    payoff: dict[str, Any]
    ratings: dict[str, Any]
    learners: dict[str, LearnerState]
    closing_rated: bool = False
    """The closing rating round (the last iteration's snapshots rated) has been recorded."""
    game_payoffs: dict[str, Any] = field(default_factory=dict)
    """A run of several games: each game's payoff table (league/records/recorder.py)."""

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "iteration": self.iteration, "next_match_id": self.next_match_id,
                "closing_rated": self.closing_rated,
                "total_env_steps": self.total_env_steps, "total_matches": self.total_matches,
                "ledger_last_seq": self.ledger.last_seq, "ledger": self.ledger.to_json(),
                "config_digest": self.config_digest, "rng": self.rng, "population": self.population.to_json(),
                "payoff": self.payoff, "ratings": self.ratings,
                **({"game_payoffs": self.game_payoffs} if self.game_payoffs else {}),
                "learners": {pid: s.to_json() for pid, s in self.learners.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckpointState":
        return cls(iteration=int(data["iteration"]), next_match_id=int(data["next_match_id"]),
                   total_env_steps=int(data["total_env_steps"]), total_matches=int(data["total_matches"]),
                   ledger=LedgerMark.from_json(data["ledger"]), config_digest=str(data["config_digest"]),
                   rng=data["rng"], population=Population.from_json(data["population"]), payoff=data["payoff"],
                   ratings=data["ratings"],
                   learners={pid: LearnerState.from_json(s) for pid, s in data["learners"].items()},
                   closing_rated=bool(data.get("closing_rated", False)),
                   game_payoffs=dict(data.get("game_payoffs", {})))


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


def write_checkpoint(run_dir: Path, state: CheckpointState, learner_tensors: dict[str, dict[str, Any]],
                     pending: PendingPlay | None) -> None:
    """Write ``checkpoints/iter-N`` completely under a temporary name, rename it, then flip the
    pointer to it: a kill at any moment leaves the previous checkpoint in force.

    A second checkpoint of the same iteration (the closing round's, or a rewrite after a kill that
    renamed a directory but did not flip the pointer) goes to a fresh ``iter-N-K``: the directory
    the pointer names is never deleted or overwritten before the pointer has moved on. Names sort
    in writing order, so pruning keeps the newest."""
    from safetensors.torch import save as safetensors_bytes

    name = f"checkpoints/iter-{state.iteration:06d}"
    rewrite = 0
    while (run_dir / name).exists():
        rewrite += 1
        name = f"checkpoints/iter-{state.iteration:06d}-{rewrite:03d}"
    directory = run_dir / name
    tmp = run_dir / f"checkpoints/.tmp-{state.iteration:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for pid, tensors in learner_tensors.items():
        atomic_write_bytes(tmp / f"learner-{pid}.safetensors",
                           safetensors_bytes({k: v.contiguous() for k, v in tensors.items()}))
    if pending is not None:
        pending.save(tmp)
    atomic_write_json(tmp / STATE_FILE, state.to_json())
    os.replace(tmp, directory)
    atomic_write_json(run_dir / CHECKPOINT_POINTER, {"path": name, "iteration": state.iteration})
    for old in sorted((run_dir / "checkpoints").glob("iter-*"))[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_directory(run_dir: Path) -> Path:
    """The directory the pointer names; a one-line RunError when the run files are not there or damaged."""
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / CHECKPOINT_POINTER).is_file():
        raise RunError(f"{run_dir} is not a Ludus run directory (no {CONFIG_FILE} / {CHECKPOINT_POINTER})")
    try:
        return run_dir / json.loads((run_dir / CHECKPOINT_POINTER).read_text())["path"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise RunError(f"{run_dir}: damaged run files ({type(exc).__name__}: {exc}); cannot resume") from None


def read_checkpoint(directory: Path) -> CheckpointState:
    """The state of a checkpoint directory; a one-line RunError if it is unreadable, damaged or
    written by another format version."""
    try:
        data = json.loads((directory / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunError(f"checkpoint {directory} is unreadable ({type(exc).__name__}); cannot resume") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version") if isinstance(data, dict) else None
        raise RunError(f"checkpoint {directory} has format {found}, expected {FORMAT_VERSION}; it was written by "
                       f"another version of Ludus")
    try:
        return CheckpointState.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunError(f"checkpoint {directory} is damaged ({type(exc).__name__}: {exc}); cannot resume") from None


def read_learner_tensors(directory: Path, player_id: str) -> dict[str, Any]:
    from safetensors.torch import load as safetensors_load

    return safetensors_load((directory / f"learner-{player_id}.safetensors").read_bytes())


def check_run_unit(run_dir: Path, state: CheckpointState, config: dict[str, Any]) -> None:
    """What the checkpoint says the run directory holds (config, ledger, snapshots), checked before
    the ledger is opened for writing: a refused resume leaves every file as it was."""
    if state.config_digest != config_digest(config):
        raise RunError(f"{run_dir}/{CONFIG_FILE} differs from the config the checkpoint was written with "
                       f"(only 'iterations' may change, through `ludus resume --iterations N`)")
    with Store.open(run_dir, mode="read") as store:
        check_ledger(store, state.ledger, run_dir)
    check_member_snapshots(run_dir, state.population.snapshots())


def check_member_snapshots(run_dir: Path, members: Iterable[Any]) -> None:
    """Each snapshot member's directory holds the snapshot (id: content hash) the run recorded for
    it: `ludus resume` and `ludus evaluate --against` refuse a snapshot swapped for another."""
    from ludus.agents.snapshot import verify_snapshot

    for member in members:
        if member.kind != "snapshot":
            continue
        path = Path(member.snapshot_path)
        ref = verify_snapshot(path if path.is_absolute() else Path(run_dir) / path)
        if ref.snapshot_id != member.snapshot_id:
            raise RunError(f"snapshot {member.player_id} at {path} holds {ref.snapshot_id[:12]}, not the "
                           f"{member.snapshot_id[:12]} the run recorded (copied over from another member?); "
                           f"restore it, or start a new run")


@contextmanager
def building_run(run_dir: Path) -> Iterator[Path]:
    """A new run is built in a sibling ``.creating-<name>-<pid>`` directory and renamed into place
    when the body completes, so a refused config or a kill during creation leaves no half run
    behind (a killed creation's directory is removed by the next creation beside it)."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise RunError(f"run directory {run_dir} already exists and is not empty; "
                       f"use `ludus resume {run_dir}` or pick another --run")
    parent = run_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_stale_creations(parent)
    building = parent / f"{CREATING_PREFIX}{run_dir.name}-{os.getpid()}"
    try:
        yield building
        if run_dir.exists():
            run_dir.rmdir()  # empty (checked above)
        os.replace(building, run_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def checked_run(run_dir: Path) -> tuple["LeagueConfig", Path, CheckpointState]:
    """The config, checkpoint directory and state of a run to resume, after checking that the run
    directory is the unit the checkpoint describes (ledger, config, snapshots); anything else is a
    one-line RunError, raised before anything is written."""
    from ludus.league.config import config_from_dict, config_to_dict

    directory = checkpoint_directory(run_dir)
    if not (run_dir / LEDGER_FILENAME).is_file():
        raise RunError(f"{run_dir}: {LEDGER_FILENAME} is missing, but the checkpoint needs the ledger it was "
                       f"written with; restore it, or start a new run")
    try:
        config = config_from_dict(json.loads((run_dir / CONFIG_FILE).read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunError(f"{run_dir}: damaged {CONFIG_FILE} ({type(exc).__name__}); cannot resume") from None
    state = read_checkpoint(directory)
    check_run_unit(run_dir, state, config_to_dict(config))
    return config, directory, state


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
