"""The league's Python API: everything `ludus train|resume|status|config|ratings|replay` does.

    from ludus.league.api import League, load_config, status, format_status
    league = League.create(load_config("tic_tac_toe", ["iterations=10"]), "runs/ttt")
    league.run(); league.close()
    print(format_status(status("runs/ttt")))

A new learner kind: `register_learner_kind(LearnerKind(...))` (league/learners/kinds.py; tests/toy_learner.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ludus.league.config import LeagueConfig, load_config, preset_names
from ludus.league.configio import describe
from ludus.league.learners.kinds import LearnerKind, learner_kind, learner_kinds, register_learner_kind
from ludus.league.records.ledger import MatchResult, Store
from ludus.league.manager import League, RunError
from ludus.league.status import MemberStatus, StatusReport, format_status, status
from ludus.league.records.ratings import Rating, RatingTable, load_params, rebuild_ratings

if TYPE_CHECKING:
    from ludus.league.records.ranking import RankingViews

__all__ = ["League", "LeagueConfig", "load_config", "preset_names", "status", "format_status", "MemberStatus",
           "StatusReport", "format_config", "default_run_dir", "stored_ratings", "rebuild_ratings_check",
           "format_ratings", "replay_match", "recorded_match", "run_ranking", "RunRanking", "format_run_ranking",
           "RANKED_KINDS", "LearnerKind", "register_learner_kind", "learner_kind", "learner_kinds"]


def default_run_dir(source: str, config: LeagueConfig) -> str:
    """runs/<preset or file stem>-s<seed>, numbered if it exists."""
    stem = Path(source).stem if source.endswith((".yaml", ".yml")) else source
    base = Path("runs") / f"{stem}-s{config.seed}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{base}-{n}")
    return str(candidate)


def format_config(config: LeagueConfig) -> str:
    rows = describe(LeagueConfig, config)
    width = max(len(k) for k, _, _ in rows)
    lines = []
    for key, value, doc in rows:
        shown = "" if value == "" else json.dumps(value)
        lines.append(f"{key:<{width}}  {shown:<22} {doc}")
    return "\n".join(lines)


def stored_ratings(run_dir: str | Path) -> dict[str, Rating]:
    """The latest rating of every rated member, as recorded in the ratings history."""
    with Store.open(Path(run_dir), mode="read") as store:
        return {pid: Rating(r.mu, r.sigma) for pid, r in store.latest_ratings().items()}


@dataclass(frozen=True)
class RebuildCheck:
    rebuilt: dict[str, Rating]
    stored: dict[str, Rating]
    rating_matches: int
    identical: bool


def rebuild_ratings_check(run_dir: str | Path) -> RebuildCheck:
    """Replay the ledger's rating matches in order; compare with the stored ratings bit for bit."""
    with Store.open(Path(run_dir), mode="read") as store:
        params = load_params(store)
        if params is None:
            raise RunError(f"{run_dir}: the ledger records no TrueSkill parameters")
        table: RatingTable = rebuild_ratings(store, params)
        stored = {pid: Rating(r.mu, r.sigma) for pid, r in store.latest_ratings().items()}
        count = store.count_matches(kinds=("rating",))
    rebuilt = table.as_dict()
    return RebuildCheck(rebuilt, stored, count, rebuilt == stored)


def format_ratings(ratings: dict[str, Rating]) -> str:
    lines = [f"{'player':<24} {'mu':>8} {'sigma':>7} {'mu-3s':>8}"]
    for pid, r in sorted(ratings.items(), key=lambda kv: -kv[1].conservative):
        lines.append(f"{pid:<24} {r.mu:8.3f} {r.sigma:7.3f} {r.conservative:8.3f}")
    return "\n".join(lines)


RANKED_KINDS = ("training", "rating", "evaluation")
"""Match kinds the Bradley-Terry views of a run read: those of the meta-game's payoff matrix
(`ludus.evaluation.metagame.payoff_matrix_from_ledger`), between frozen members only."""


@dataclass(frozen=True, eq=False)
class RunRanking:
    """`ludus ratings`: TrueSkill as stored beside the Bradley-Terry views of the same members."""

    run_dir: str
    trueskill: dict[str, Rating]
    views: "RankingViews | None"
    """None when no two frozen members have played each other yet."""
    members: tuple[str, ...]
    """The frozen members (snapshots and anchors) the views may rate, in joining order."""
    matches: int
    """Ledger matches read (of `RANKED_KINDS`)."""

    def to_json(self) -> dict:
        ts = {pid: {"mu": r.mu, "sigma": r.sigma, "conservative": r.conservative} for pid, r in self.trueskill.items()}
        return {"run_dir": self.run_dir, "kinds": list(RANKED_KINDS), "players": "frozen members (snapshots and "
                "anchors); live learners excluded", "matches": self.matches, "trueskill": ts,
                "bradley_terry": None if self.views is None else self.views.to_json()}


def run_ranking(run_dir: str | Path, rounds: int = 1000, seed: int = 0) -> RunRanking:
    """Bradley-Terry with bootstrap intervals, Nash averaging, rank stability and forfeits of a
    run's frozen members, from the pairs of its training, rating and evaluation matches in which
    two of them met (a live learner's row mixes all its versions, so it is left out, as in the
    meta-game). Deterministic for a given `seed`."""
    from ludus.league.records.ranking import RankingError, ledger_records, ranking_views
    from ludus.league.rundata import read_run

    run = read_run(run_dir)
    frozen = tuple(m.player_id for m in run.members if m.kind != "learner")
    with Store.open(run.run_dir, mode="read") as store:
        trueskill = {pid: Rating(r.mu, r.sigma) for pid, r in store.latest_ratings().items()}
        matches = [rec.result for rec in store.iter_matches(kinds=RANKED_KINDS)]
    records = ledger_records(matches, frozen)
    try:
        views = ranking_views(records, rounds=rounds, seed=seed) if records.games else None
    except RankingError as exc:
        raise RunError(f"{run_dir}: {exc}") from None
    return RunRanking(str(run_dir), trueskill, views, frozen, len(matches))


def format_run_ranking(ranking: RunRanking) -> str:
    from ludus.league.records.ranking import TIES, format_views

    views = ranking.views
    if views is None:
        return format_ratings(ranking.trueskill) + "\n(no games between two frozen members yet: no Bradley-Terry ratings)"
    iv = views.intervals
    lines = [f"{ranking.run_dir}: TrueSkill (as rated by the run) and Bradley-Terry over {views.board.games:,} games "
             f"between frozen members in {ranking.matches:,} training, rating and evaluation matches (live learners "
             f"excluded); {TIES}; BT on the Elo-like scale (mean 1000), 95% intervals from {views.rounds} bootstrap "
             f"rounds (seed {views.seed}); nash: score against the max-entropy Nash mixture (unplayed pairs even)"]
    lines += format_views(views, ranking.trueskill)
    unrated = [p for p in ranking.members if p not in views.ratings.players]
    if unrated:
        lines.append(f"no games against another frozen member yet: {', '.join(unrated)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Replay:
    match_id: int
    recorded_returns: tuple[float, ...]
    replayed_returns: tuple[float, ...]
    transcript: str

    @property
    def matches(self) -> bool:
        return self.recorded_returns == self.replayed_returns


def recorded_match(run_dir: str | Path, match_id: int) -> MatchResult:
    """A match of a run, as the ledger holds it."""
    with Store.open(Path(run_dir), mode="read") as store:
        match = store.get_match(match_id)
    if match is None:
        raise RunError(f"match {match_id} is not in the ledger of {run_dir}; `ludus matches {run_dir}` lists "
                       f"the run's matches")
    return match


def replay_match(run_dir: str | Path, match_id: int) -> Replay:
    """Re-simulate a match from its seed and recorded moves; compare the returns with the ledger."""
    from ludus.games.registry import make
    from ludus.league.records.replay import (recorded_reasoning, recorded_texts, replay_forfeit, replay_moves,
                                             replay_prefix)

    match = recorded_match(run_dir, match_id)
    game = make(match.game_id)
    moves = match.moves
    if moves is None:
        raise RunError(f"match {match_id} has no recorded moves")
    header = f"match {match_id} ({match.kind}, {match.game_id}): {' vs '.join(match.player_ids)}, seed {match.seed}"
    texts, notes = recorded_texts(match), recorded_reasoning(match)
    forfeited = [seat.status != "ok" for seat in match.seats]
    failed = [seat.error for seat in match.seats if seat.status == "error"]
    if failed and texts is not None:  # the game itself failed: its prefix, then the error, no result
        lines, _ = replay_prefix(game, match.seed, moves, texts=texts, notes=notes)
        transcript = "\n".join([header, *lines, f"the game failed: {failed[0]}"])
        same = game.record().error == failed[0]  # type: ignore[attr-defined]
        return Replay(match_id, tuple(s.episode_return for s in match.seats),
                      tuple(float(r) for r in game.returns()) if same else (), transcript)
    if any(forfeited):
        returns, transcript = replay_forfeit(game, match.seed, moves, forfeited, header=header, texts=texts,
                                             notes=notes)
    else:
        returns, transcript = replay_moves(game, match.seed, moves, header=header, texts=texts, notes=notes)
    recorded = tuple(s.episode_return for s in match.seats)
    return Replay(match_id, recorded, tuple(float(r) for r in returns), transcript)
