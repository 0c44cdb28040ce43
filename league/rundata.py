"""Read-only views of a league run directory (safe while the run trains): the one reader of run
directories that the league's status, evaluation and reports share.

Everything here reads: `config.json`, the checkpoint pointer and the `state.json` it points to
(all written atomically by the manager), and the ledger through `Store.open(mode="read")`. Nothing
is created, locked or modified in the run directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ludus.league.checkpoint import CHECKPOINT_POINTER, CONFIG_FILE, STATE_FILE, CheckpointState, RunError
from ludus.league.records.ledger import Store
from ludus.league.records.population import Member, with_absolute_paths
from ludus.league.records.ratings import TrueSkillParams, load_params

_POINTER_RETRIES = 3
"""The manager keeps two checkpoints and deletes older ones: a pointer read just before a newer
checkpoint replaces it may name a directory that is gone by the time we open it; read again."""


@dataclass(frozen=True)
class RunView:
    """What a run directory says about itself at one moment."""

    run_dir: Path
    game_id: str
    """Registry id of the game the run plays."""
    config: Mapping[str, Any]
    """The run's config.json (a `LeagueConfig` as a dict)."""
    iteration: int
    """Iterations completed at the checkpoint read."""
    total_matches: int
    total_env_steps: int
    members: tuple[Member, ...]
    """The population at that checkpoint, in joining order, snapshot paths made absolute."""
    learner_snapshots: Mapping[str, str | None]
    """Each live learner's latest snapshot player id (None before its first)."""

    def frozen(self, include_anchors: bool = True) -> list[Member]:
        """Snapshots (and anchors if asked): the members a checkpoint can be evaluated against."""
        return [m for m in self.members
                if m.kind == "snapshot" or (include_anchors and m.kind == "anchor")]

    def member(self, player_id: str) -> Member | None:
        return next((m for m in self.members if m.player_id == player_id), None)


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_run(run_dir: str | os.PathLike) -> RunView:
    """The run's config and population at its latest checkpoint; `RunError` if it is not a run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory {run_dir} does not exist; pass the directory `ludus train` wrote")
    try:
        config = _load_json(run_dir / CONFIG_FILE)
        for attempt in range(_POINTER_RETRIES):
            pointer = _load_json(run_dir / CHECKPOINT_POINTER)
            state_path = run_dir / pointer["path"] / STATE_FILE
            if state_path.is_file() or attempt == _POINTER_RETRIES - 1:
                break
        checkpoint = CheckpointState.from_json(_load_json(state_path))
    except FileNotFoundError as exc:
        raise RunError(f"{run_dir} is not a Ludus run directory (missing {Path(exc.filename).name})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RunError(f"{run_dir}: damaged run files ({exc.__class__.__name__}); cannot read the run") from None
    return RunView(run_dir=run_dir, game_id=config["game"], config=config, iteration=checkpoint.iteration,
                   total_matches=checkpoint.total_matches, total_env_steps=checkpoint.total_env_steps,
                   members=tuple(with_absolute_paths(checkpoint.population.members(), run_dir.absolute())),
                   learner_snapshots={pid: s.last_snapshot for pid, s in checkpoint.learners.items()})


def open_ledger(run_dir: str | os.PathLike) -> Store:
    """The run's ledger, read-only (use as a context manager)."""
    return Store.open(Path(run_dir), mode="read")


def trueskill_params(store: Store, config: Mapping[str, Any]) -> TrueSkillParams:
    """The TrueSkill constants the run rates with: stored in the ledger, else built as the manager
    builds them from the config (a run that has not rated anything yet)."""
    stored = load_params(store)
    if stored is not None:
        return stored
    return TrueSkillParams(draw_probability=max(float(config.get("draw_probability", 0.1)), 1e-6))
