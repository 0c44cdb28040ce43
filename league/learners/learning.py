"""The live learners of a league: their bookkeeping, the learn phase and the snapshot phase.

A `Learner` wraps one role's `LeagueLearner` (the pure compute: `update(batch)`, `freeze`,
`state_dict`) with what the league counts about it: env steps trained on, snapshots taken,
resets, and its score against the pool since its last snapshot (the window that AlphaStar's
freezing rule reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ludus.agents.rollout import RolloutBatch
from ludus.agents.snapshot import Lineage
from ludus.league.checkpoint import LearnerState
from ludus.league.config import LeagueConfig, RoleConfig
from ludus.games.core import GameSpec
from ludus.league.learners.base import LeagueLearner, module_weights
from ludus.league.learners.kinds import learner_kind
from ludus.league.records.matchmaking import snapshot_due
from ludus.league.records.population import Member
from ludus.league.play.runner import LearnerWeights, PlayResult

MIN_WINDOW_GAMES = 20
"""Games against the pool before the win-rate rule may freeze a learner (too few: pure noise)."""


@dataclass
class Learner:
    """A live learner: one role's learner and its league bookkeeping (mutable, loop-internal)."""

    role: RoleConfig
    impl: LeagueLearner
    state: LearnerState

    @property
    def player_id(self) -> str:
        return self.role.name

    @property
    def version(self) -> int:
        return self.impl.updates

    @property
    def last_snapshot(self) -> str | None:
        """player_id of its latest snapshot."""
        return self.state.last_snapshot

    def weights(self) -> LearnerWeights:
        return LearnerWeights(self.player_id, self.version, module_weights(self.impl.module))

    def count_game(self, score: float) -> None:
        """One game against the pool: 1 win, 0.5 draw, 0 loss (the freezing window)."""
        wins, draws, games = self.state.window
        self.state = self.state.replace(window=(wins + (score == 1.0), draws + (score == 0.5), games + 1))

    def count_return(self, episode_return: float) -> None:
        """Its return in one training game against the pool (the plateau rule's signal)."""
        total, games = self.state.returns
        self.state = self.state.replace(returns=(total + episode_return, games + 1))


@dataclass(frozen=True)
class LearnReport:
    losses: dict[str, dict[str, float]]
    """Per learner, the update's statistics by name."""
    policy_lag: float
    """Mean versions between the weights that played a row and the weights it trained."""
    dropped: int
    """Rows older than `max_policy_lag`, not trained on."""


def make_learner(spec: GameSpec, config: LeagueConfig, role_index: int, seed: int, init_seed: int,
                 ranks=None) -> LeagueLearner:
    """The learner of role `role_index` of the kind `config.learner` names (`ludus.league.learners.kinds`);
    with `ranks` (a `ludus.league.learners.ranks.RankGroup`), on data-parallel ranks: this process and the group's."""
    return learner_kind(config.learner).make(spec, config, role_index, seed, init_seed, ranks)


def make_learner_architecture(config: LeagueConfig):
    """The `PolicyArchitecture` of `config.learner`'s policies with the league's `net`, without
    building a learner: an evaluation plays a run's frozen members with it (each loads from its own
    manifest, so a role with its own `net` needs nothing more; LM members load onto its `lm_base`)."""
    return learner_kind(config.learner).architecture(config)


def learn(learners: Mapping[str, Learner], results: list[PlayResult], max_policy_lag: int,
          progress: float) -> LearnReport:
    """One update per learner on the rows its runners recorded this iteration (stale rows dropped)."""
    losses: dict[str, dict[str, float]] = {}
    lags, dropped_total = [], 0
    for player_id, learner in learners.items():
        batch = _concat([r.rollouts[player_id] for r in results if player_id in r.rollouts])
        if batch is None or len(batch) == 0:
            continue
        lag = learner.version - batch.policy_version
        keep = lag <= max_policy_lag
        dropped = int((~keep).sum())
        if dropped:
            batch = batch.rows(keep)
            dropped_total += dropped
            learner.state = learner.state.replace(dropped_stale=learner.state.dropped_stale + dropped)
        if len(batch) == 0:
            continue
        losses[player_id] = learner.impl.update(batch, progress=progress)
        learner.state = learner.state.replace(steps=learner.state.steps + len(batch))
        lags.append(float(lag[keep].mean()))
    return LearnReport(losses, float(np.mean(lags)) if lags else 0.0, dropped_total)


def track_gain(learner: Learner) -> None:
    """Fold this iteration's mean training return into the plateau rule's state and start a new
    iteration's sums. Smoothed by an exponential moving average spanning `snapshot_on_plateau`
    iterations (weight 2 / (span + 1)); a new best must beat the old one by `plateau_min_gain`."""
    total, games = learner.state.returns
    span = learner.role.snapshot_on_plateau
    if not span or not games:
        learner.state = learner.state.replace(returns=(0.0, 0.0))
        return
    mean = total / games
    if learner.state.gain is None:
        gain = (mean, mean, 0)
    else:
        smoothed, best, stale = learner.state.gain
        smoothed += 2.0 / (span + 1) * (mean - smoothed)
        gain = (smoothed, smoothed, 0) if smoothed > best + learner.role.plateau_min_gain else (smoothed, best, stale + 1)
    learner.state = learner.state.replace(returns=(0.0, 0.0), gain=gain)


def plateaued(learner: Learner) -> bool:
    """The learner's smoothed training return has not made a new best for `snapshot_on_plateau` iterations."""
    span = learner.role.snapshot_on_plateau
    return bool(span) and learner.state.gain is not None and learner.state.gain[2] >= span


def due_for_snapshot(learner: Learner, config: LeagueConfig) -> bool:
    """The one freezing rule (matchmaking.snapshot_due) with this league's thresholds, or a plateau."""
    s = learner.state
    if plateaued(learner):
        return True
    wins, draws, games = s.window
    threshold = config.snapshot_win_rate_lcb if config.snapshot_win_rate_lcb > 0 and games >= MIN_WINDOW_GAMES else None
    return snapshot_due(s.steps - s.steps_at_snapshot, config.snapshot_every_steps, wins, draws, games, threshold)


def freeze(learner: Learner, run_dir: Path, iteration: int, parent_snapshot_id: str | None) -> Member:
    """Freeze the learner's current weights into `snapshots/<role>@<n>`; the new member."""
    s = learner.state
    player_id = f"{learner.player_id}@{s.snapshots}"
    directory = run_dir / "snapshots" / player_id
    ref = learner.impl.freeze(directory, Lineage(parent=parent_snapshot_id, role=learner.role.name, steps=s.steps,
                                                 created_by="ludus train"))
    member = Member(player_id, "snapshot", learner.role.name, snapshot_path=str(directory.relative_to(run_dir)),
                    snapshot_id=ref.snapshot_id, parent=s.last_snapshot, iteration=iteration, steps=s.steps)
    learner.state = s.replace(snapshots=s.snapshots + 1, last_snapshot=player_id, steps_at_snapshot=s.steps,
                              window=(0.0, 0.0, 0.0), gain=None)
    return member


def reset_due(learner: Learner) -> bool:
    """AlphaStar resets a league exploiter to its initial weights after every `reset_every` snapshots."""
    every = learner.role.reset_every_snapshots
    n = learner.state.snapshots
    return bool(every) and n > 1 and (n - 1) % every == 0


def reset(learner: Learner, run_dir: Path, seed: int) -> None:
    """Back to the role's first snapshot with a fresh optimizer."""
    learner.impl.reset_to(run_dir / "snapshots" / f"{learner.player_id}@0", seed=seed)
    learner.state = learner.state.replace(resets=learner.state.resets + 1)


def _concat(batches: list[RolloutBatch]) -> RolloutBatch | None:
    if not batches:
        return None
    if len(batches) == 1:
        return batches[0]
    fields = RolloutBatch.__dataclass_fields__
    return RolloutBatch(**{name: None if getattr(batches[0], name) is None
                           else np.concatenate([getattr(b, name) for b in batches]) for name in fields})

