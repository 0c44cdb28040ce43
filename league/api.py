"""The league's Python API: everything `ludus train|resume|status|config|ratings|replay` does.

    from league.api import League, load_config, status, format_status
    league = League.create(load_config("tic_tac_toe", ["iterations=10"]), "runs/ttt")
    league.run(); league.close()
    print(format_status(status("runs/ttt")))
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from league.config import LeagueConfig, load_config, preset_names
from league.configio import describe
from league.ledger import Store
from league.manager import League, RunError
from league.rundata import read_run
from league.ratings import Rating, RatingTable, load_params, rebuild_ratings

__all__ = ["League", "LeagueConfig", "load_config", "preset_names", "status", "format_status", "format_config",
           "default_run_dir", "stored_ratings", "rebuild_ratings_check", "format_ratings", "replay_match"]


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


@dataclass(frozen=True)
class MemberStatus:
    """One row of the population table."""

    player_id: str
    kind: str
    role: str
    mu: float | None
    sigma: float | None
    games: int
    score: float | None
    """Mean outcome (win 1, draw .5) over all its recorded games."""
    parent: str | None
    iteration: int
    recent_return: float | None = None
    """Mean episode return over its last `RECENT_GAMES` games (what a one-player game is judged by)."""
    recent_length: float | None = None
    """Mean length (steps) of those games."""

    @property
    def conservative(self) -> float | None:
        return None if self.mu is None else self.mu - 3 * self.sigma


@dataclass(frozen=True)
class StatusReport:
    """What `ludus status` shows."""

    run_dir: str
    game: str
    iteration: int
    iterations: int
    total_matches: int
    total_env_steps: int
    members: tuple[MemberStatus, ...]

    def to_json(self) -> dict:
        return {
            "run_dir": self.run_dir, "game": self.game, "iteration": self.iteration,
            "iterations": self.iterations, "total_matches": self.total_matches,
            "total_env_steps": self.total_env_steps,
            "members": [{**m.__dict__, "conservative": m.conservative} for m in self.members],
        }


RECENT_GAMES = 100


def status(run_dir: str | Path) -> StatusReport:
    """The population table, read-only (works while the run trains)."""
    run = read_run(Path(run_dir))
    with Store.open(run.run_dir, mode="read") as store:
        latest = store.latest_ratings()
        games: dict[str, int] = {}
        score: dict[str, float] = {}
        recent: dict[str, deque[tuple[float, int]]] = {}
        for rec in store.iter_matches():
            seen = set()
            for seat in rec.result.seats:
                if seat.player_id in seen:
                    continue  # a team's seats share one policy: one game, one outcome
                seen.add(seat.player_id)
                games[seat.player_id] = games.get(seat.player_id, 0) + 1
                score[seat.player_id] = score.get(seat.player_id, 0.0) + seat.outcome
                recent.setdefault(seat.player_id, deque(maxlen=RECENT_GAMES)).append(
                    (seat.episode_return, rec.result.length))
    members = []
    for m in run.members:
        r = latest.get(m.player_id)
        n = games.get(m.player_id, 0)
        last = recent.get(m.player_id)
        members.append(MemberStatus(m.player_id, m.kind, m.role, r.mu if r else None, r.sigma if r else None, n,
                                    score[m.player_id] / n if n else None, m.parent, m.iteration,
                                    float(np.mean([x for x, _ in last])) if last else None,
                                    float(np.mean([x for _, x in last])) if last else None))
    members.sort(key=lambda m: (m.conservative is None, -(m.conservative or 0.0), m.player_id))
    return StatusReport(str(run_dir), run.game_id, run.iteration, run.config["iterations"], run.total_matches,
                        run.total_env_steps, tuple(members))


def format_status(report: StatusReport) -> str:
    lines = [f"run {report.run_dir}  game {report.game}  iteration {report.iteration}/{report.iterations}  "
             f"matches {report.total_matches:,}  env steps {report.total_env_steps:,}",
             f"{'player':<24} {'kind':<9} {'role':<17} {'mu':>7} {'sigma':>6} {'mu-3s':>7} {'games':>7} {'score':>6} "
             f"{'return':>9} {'length':>7}"]
    for m in report.members:
        mu = f"{m.mu:7.2f}" if m.mu is not None else f"{'-':>7}"
        sigma = f"{m.sigma:6.2f}" if m.sigma is not None else f"{'-':>6}"
        cons = f"{m.conservative:7.2f}" if m.conservative is not None else f"{'-':>7}"
        score = f"{m.score:6.3f}" if m.score is not None else f"{'-':>6}"
        ret = f"{m.recent_return:9.3g}" if m.recent_return is not None else f"{'-':>9}"
        length = f"{m.recent_length:7.1f}" if m.recent_length is not None else f"{'-':>7}"
        lines.append(f"{m.player_id:<24} {m.kind:<9} {m.role:<17} {mu} {sigma} {cons} {m.games:>7} {score} {ret} {length}")
    lines.append(f"(return, length: means over each player's last {RECENT_GAMES} games)")
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


@dataclass(frozen=True)
class Replay:
    match_id: int
    recorded_returns: tuple[float, ...]
    replayed_returns: tuple[float, ...]
    transcript: str

    @property
    def matches(self) -> bool:
        return self.recorded_returns == self.replayed_returns


def replay_match(run_dir: str | Path, match_id: int) -> Replay:
    """Re-simulate a match from its seed and recorded moves; compare the returns with the ledger."""
    from games.registry import make
    from league.replay import replay_forfeit, replay_moves

    with Store.open(Path(run_dir), mode="read") as store:
        match = store.get_match(match_id)
    if match is None:
        raise RunError(f"match {match_id} is not in the ledger of {run_dir}")
    game = make(match.game_id)
    moves = match.moves
    if moves is None:
        raise RunError(f"match {match_id} has no recorded moves")
    header = f"match {match_id} ({match.kind}): {' vs '.join(match.player_ids)}, seed {match.seed}"
    forfeited = [seat.status != "ok" for seat in match.seats]
    if any(forfeited):
        returns, transcript = replay_forfeit(game, match.seed, moves, forfeited, header=header)
    else:
        returns, transcript = replay_moves(game, match.seed, moves, header=header)
    recorded = tuple(s.episode_return for s in match.seats)
    return Replay(match_id, recorded, tuple(float(r) for r in returns), transcript)
