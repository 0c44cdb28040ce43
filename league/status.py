"""`ludus status`: a run's population table, read-only, without importing torch.

Only the run directory's JSON files and the ledger are read (league/rundata.py, league/records/ledger.py),
and the ledger's per-player sums are computed by SQLite, so the table answers quickly while the
run trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ludus.league.records.ledger import Store
from ludus.league.rundata import read_run


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
        played = store.player_games(RECENT_GAMES)  # a team's seats share one policy: one game, one outcome
    members = []
    for m in run.members:
        r = latest.get(m.player_id)
        g = played.get(m.player_id)
        members.append(MemberStatus(m.player_id, m.kind, m.role, r.mu if r else None, r.sigma if r else None,
                                    g.games if g else 0, g.score / g.games if g else None, m.parent, m.iteration,
                                    g.recent_return if g else None, g.recent_length if g else None))
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
