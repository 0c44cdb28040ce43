"""The arena's leaderboard: TrueSkill ratings from the ledger, as text and as a static HTML page.

Ratings are a pure function of the ledger (`ludus.league.records.ratings.rebuild_ratings` over the 'arena'
matches); entrants are ranked by the conservative estimate mu - 3 sigma (a skill the entrant
exceeds with ~99.9% probability), so a newcomer with few games ranks low until its rating
settles. The people who played entrants at the service's web seat (``human:ACCOUNT``,
arena/human.py) are members of the board beside the entrants, rated by the same matches. The
95% interval is mu +- 1.96 sigma. Forfeits count as losses: an agent that crashes
or times out is rated by what it did.

Beside TrueSkill (online, so it depends on the order of the games) the board carries the
order-free views of `ludus.league.records.ranking` over the same arena matches: Bradley-Terry with 95%
bootstrap intervals of the rating and the rank, the rank-stability figure (how few games must go
to reorder the top 3), each entrant's forfeit, error, timeout and invalid-answer rates, its
Bradley-Terry rating without forfeited matches and a warning where a rank depends on forfeits;
with matches of several games, per-game boards and a combined one (equal weight per game). The
slow parts (1,000 bootstrap rounds, Nash averaging, the stability search) are computed in full
here; the service, which rebuilds the board every second, carries them over through a
`RankingCache` between full computations.

The page (`write_page`) is one self-contained HTML file: inline CSS, inline SVG charts from
`ludus.charts` (ratings over time with interval bands, a bar chart of mu with its
interval, the head-to-head heatmap), no scripts, no external ``src`` or ``href``. Its match list
links each match to its replay player written beside it, ``<page stem>_replays/match-<id>.html``
(with its text transcript, ``match-<id>.txt``).
"""

from __future__ import annotations

import collections
import html
import os
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ludus.arena.store import HUMAN_KIND, read_humans, read_info, tournament_key
from ludus.league.records.ledger import MatchResult, Store
from ludus.league.records.ranking import TIES, RankingError, RankingViews, ledger_records, ranking_views
from ludus.league.records.ratings import RatingTable, TrueSkillParams, load_params, rebuild_ratings

INTERVAL_Z = 1.96
"""Standard-normal quantile of the two-sided 95% interval of a skill estimate."""
MAX_RATING_LINES = 12
"""Lines in the ratings chart (the best by conservative rating); the table lists everyone."""


@dataclass(frozen=True)
class LeaderboardRow:
    """One entrant's standing."""

    rank: int
    player_id: str
    kind: str
    """'submission', 'bot' or 'human' (a person who played at the service's web seat)."""
    submission_kind: str
    """'python', 'executable', 'snapshot', 'builtin' or 'human'."""
    mu: float
    sigma: float
    wins: int
    draws: int
    losses: int
    faults: Mapping[str, int]
    """Forfeited games by status ('error', 'timeout', 'invalid')."""

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def conservative(self) -> float:
        return self.mu - 3.0 * self.sigma

    @property
    def interval(self) -> tuple[float, float]:
        """95% interval of the skill: mu +- 1.96 sigma."""
        return self.mu - INTERVAL_Z * self.sigma, self.mu + INTERVAL_Z * self.sigma


@dataclass(frozen=True)
class HeadToHead:
    """Results between every two entrants, from the row entrant's side, in rank order."""

    players: tuple[str, ...]
    wins: tuple[tuple[int, ...], ...]
    draws: tuple[tuple[int, ...], ...]
    losses: tuple[tuple[int, ...], ...]

    def games(self, i: int, j: int) -> int:
        return self.wins[i][j] + self.draws[i][j] + self.losses[i][j]

    def score(self, i: int, j: int) -> float | None:
        """Mean outcome of row i against column j (win 1, draw 1/2, loss 0); None if they never met."""
        n = self.games(i, j)
        return None if n == 0 else (self.wins[i][j] + 0.5 * self.draws[i][j]) / n


@dataclass(frozen=True)
class RatingPoint:
    """A rating right after the match at ledger position `seq`."""

    seq: int
    mu: float
    sigma: float


@dataclass(frozen=True)
class Leaderboard:
    """Everything `format_leaderboard` and `render_html` show."""

    arena_dir: str
    game: str
    params: TrueSkillParams
    rows: tuple[LeaderboardRow, ...]
    """Ranked by mu - 3 sigma, best first."""
    head_to_head: HeadToHead
    history: Mapping[str, tuple[RatingPoint, ...]]
    """Each entrant's ratings history (from the ledger's ratings_history)."""
    total_matches: int
    recent_matches: tuple[MatchResult, ...]
    """The newest matches, newest first (the page lists them with their replays)."""
    tournaments: tuple[Mapping[str, Any], ...]
    """The tournaments' meta entries, oldest first."""
    ranking: RankingViews | None = None
    """Bradley-Terry, intervals, stability and forfeit views of the same matches (None: no games
    between two active entrants yet)."""

    def bt_row(self, player_id: str) -> dict | None:
        """The entrant's Bradley-Terry row (`RankingViews.rows`), or None if it has no games."""
        if self.ranking is None:
            return None
        return next((r for r in self.ranking.rows() if r["player"] == player_id), None)

    def row(self, player_id: str) -> LeaderboardRow:
        for r in self.rows:
            if r.player_id == player_id:
                return r
        raise KeyError(player_id)


class RankingCache:
    """The slow rating views of the last full computation, for a board rebuilt every second.

    A build whose ledger and entrants are unchanged reuses the views as they are; one whose
    ledger grew fits the Bradley-Terry point ratings and the forfeit views afresh (~25 ms on 2,000
    matches) and carries the bootstrap intervals, Nash averaging, per-game boards and the
    stability search over from the last full computation, which is redone once `min_interval_s`
    has passed and the views are behind the ledger (or at once when the entrants changed). The
    board states how many games the carried views rest on."""

    def __init__(self, min_interval_s: float = 30.0):
        self.min_interval_s = min_interval_s
        self.key: tuple | None = None
        self.full: RankingViews | None = None
        self.full_key: tuple | None = None
        self.views: RankingViews | None = None
        self.computed_at = -float("inf")

    def views_for(self, key: tuple, records) -> RankingViews | None:
        due = time.monotonic() - self.computed_at >= self.min_interval_s
        if key == self.key and not (due and self.views is not None and self.views.stale):
            return self.views
        if not records.games:
            views = None
        elif self.full is None or self.full_key[1] != key[1] or due:
            views = self.full = ranking_views(records)
            self.full_key, self.computed_at = key, time.monotonic()
        else:
            views = self.full.with_point_fit(ranking_views(records, slow=False))
        self.key, self.views = key, views
        return views


def build_leaderboard(store: Store, recent: int = 200, cache: RankingCache | None = None) -> Leaderboard:
    """Read the leaderboard from an arena's store (read-only access suffices). Withdrawn entrants
    are left out; their matches stay in the ledger and in their opponents' records. `cache`
    (the service's) spares the slow rating views between full computations; without it they are
    computed in full."""
    from ludus.arena.accounts import active_entrants

    info = read_info(store)
    params = load_params(store) or TrueSkillParams()
    entrants = active_entrants(store)
    table: RatingTable = rebuild_ratings(store, params, kinds=("arena",))
    # (kind, submission kind) of every member of the board: the entrants and the people who played
    # at the service's web seat, rated by the same matches
    by_id: dict[str, tuple[str, str]] = {e.player_id: (e.kind, e.submission_kind.value) for e in entrants}
    by_id.update({h.player_id: (HUMAN_KIND, HUMAN_KIND) for h in read_humans(store)})
    ids = list(by_id)
    index = {pid: i for i, pid in enumerate(ids)}
    n = len(ids)
    wins = [[0] * n for _ in range(n)]
    draws = [[0] * n for _ in range(n)]
    losses = [[0] * n for _ in range(n)]
    faults: dict[str, collections.Counter] = {pid: collections.Counter() for pid in ids}
    newest: collections.deque[MatchResult] = collections.deque(maxlen=recent)
    total, last_seq, played = 0, 0, []
    for recorded in store.iter_matches(kinds=("arena",)):
        match = recorded.result
        total += 1
        last_seq = recorded.seq
        played.append(match)
        newest.appendleft(match)
        for player_id, status in {(seat.player_id, seat.status) for seat in match.seats}:  # once per match
            if status != "ok" and player_id in faults:
                faults[player_id][status] += 1
        # One seat per side (in a team game, the first seat of each side: its seats share one outcome).
        sides: dict[int, list] = {}
        for seat in match.seats:
            sides.setdefault(seat.team, []).append(seat)
        if len(sides) != 2 or any(len({s.player_id for s in seats}) != 1 for seats in sides.values()):
            continue
        a, b = (seats[0] for seats in sides.values())
        if a.player_id not in index or b.player_id not in index:
            continue
        i, j = index[a.player_id], index[b.player_id]
        for (me, them, seat) in ((i, j, a), (j, i, b)):
            if seat.outcome == 1.0:
                wins[me][them] += 1
            elif seat.outcome == 0.0:
                losses[me][them] += 1
            else:
                draws[me][them] += 1
    ranked = sorted(ids, key=lambda pid: (-table.rating(pid).conservative, pid))
    rows = []
    for rank, pid in enumerate(ranked, 1):
        r = table.rating(pid)
        i = index[pid]
        rows.append(LeaderboardRow(rank, pid, *by_id[pid], r.mu, r.sigma,
                                   sum(wins[i]), sum(draws[i]), sum(losses[i]), dict(faults[pid])))
    order = [index[pid] for pid in ranked]

    def permute(matrix: list[list[int]]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(matrix[i][j] for j in order) for i in order)

    history: dict[str, list[RatingPoint]] = {pid: [] for pid in ids}
    for point in store.ratings_history():
        if point.player_id in history:
            history[point.player_id].append(RatingPoint(point.seq, point.mu, point.sigma))
    tournaments = []
    number = 1
    while (entry := store.get_meta(tournament_key(number))) is not None:
        tournaments.append(entry)
        number += 1
    records = ledger_records(played, ids)
    try:
        views = (cache or RankingCache()).views_for((last_seq, tuple(ids)), records)
    except RankingError:
        views = None
    return Leaderboard(str(store.directory), info.game if info else "?", params, tuple(rows),
                       HeadToHead(tuple(ranked), permute(wins), permute(draws), permute(losses)),
                       {pid: tuple(points) for pid, points in history.items()}, total, tuple(newest),
                       tuple(tournaments), views)


# ------------------------------------------------------------------------------------------- text


def _faults_text(faults: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(faults.items())) or "-"


def _bt_cells(board: Leaderboard, player_id: str) -> tuple[str, str, str, str]:
    """(BT rating, its 95% interval, rank interval, forfeit rate) as text; '-' where unknown."""
    row = board.bt_row(player_id)
    if row is None:
        return "-", "-", "-", "-"
    span = f"[{row['low']:.0f}, {row['high']:.0f}]" if row["low"] is not None else "-"
    ranks = f"{row['rank_low']}-{row['rank_high']}" if row["rank_low"] is not None else "-"
    rate = f"{row['forfeit_rate']:.1%}" if row["forfeit_rate"] is not None else "-"
    return f"{row['rating']:.0f}", span, ranks, rate


def ranking_notes(board: Leaderboard) -> list[str]:
    """What the Bradley-Terry columns are, the rank-stability line, forfeit rates by kind, the
    ratings without forfeited matches, forfeit-dependence warnings and (several games) the
    member x game table: the lines under the table."""
    views = board.ranking
    if views is None:
        return ["Bradley-Terry: no games between two entrants yet"]
    lines = [f"BT: Bradley-Terry over {views.board.games} games (pairs of seats), {TIES}, Elo-like scale (mean 1000); "
             f"95% intervals of rating and rank from {views.rounds} bootstrap rounds (seed {views.seed})"
             + (f", as of {views.slow_games} games" if views.stale else "")
             + ("; combined board: every game the same total weight" if views.multi_game else ""),
             views.stability_text() + (f" (as of {views.slow_games} games)" if views.stale else ""),
             "forfeit: share of its matches the entrant lost by its own fault (error, timeout or invalid answer)"]
    if views.without_forfeits is not None:
        clean = views.without_forfeits
        lines.append("BT without forfeited matches: " + ", ".join(
            f"{clean.players[i]} {clean.rating[i]:.0f}" for i in clean.order()))
    lines += [f"warning: {w.text}" for w in views.warnings]
    if views.multi_game:
        from ludus.league.records.ranking import format_game_table

        lines += format_game_table(views, "entrant")
    return lines


def format_leaderboard(board: Leaderboard) -> str:
    """The ranking table (TrueSkill and Bradley-Terry side by side), the notes under it (see
    `ranking_notes`), then the head-to-head matrix (scores in percent)."""
    lines = [f"arena {board.arena_dir}: {board.game}, {len(board.rows)} entrants, {board.total_matches} matches "
             f"in {len(board.tournaments)} tournament(s); ranked by TrueSkill mu - 3 sigma"]
    width = max([len(r.player_id) for r in board.rows] + [7])
    lines.append(f"{'rank':>4}  {'entrant':<{width}} {'mu':>7} {'sigma':>6} {'mu-3s':>7}  {'95% interval':<16} "
                 f"{'BT':>5} {'BT 95%':<12} {'ranks':<6} {'W':>4} {'D':>4} {'L':>4} {'games':>5} {'forfeit':>7}  forfeits")
    for r in board.rows:
        low, high = r.interval
        bt, span, ranks, rate = _bt_cells(board, r.player_id)
        lines.append(f"{r.rank:>4}  {r.player_id:<{width}} {r.mu:>7.2f} {r.sigma:>6.2f} {r.conservative:>7.2f}  "
                     f"{f'[{low:.1f}, {high:.1f}]':<16} {bt:>5} {span:<12} {ranks:<6} {r.wins:>4} {r.draws:>4} "
                     f"{r.losses:>4} {r.games:>5} {rate:>7}  {_faults_text(r.faults)}")
    lines += ranking_notes(board)
    h2h = board.head_to_head
    if len(h2h.players) >= 2:
        lines.append("")
        lines.append("head-to-head: score of the row against the column in % (win 1, draw 1/2); '-' never met")
        lines.append(" " * (width + 6) + "".join(f"{k:>5}" for k in range(1, len(h2h.players) + 1)))
        for i, pid in enumerate(h2h.players):
            cells = []
            for j in range(len(h2h.players)):
                score = h2h.score(i, j)
                cells.append("    ." if i == j else "    -" if score is None else f"{100 * score:>5.0f}")
            lines.append(f"{i + 1:>4}  {pid:<{width}}" + "".join(cells))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- page

_CSS = """
tr.forfeit td { background: #fff4f0; } .status-ok { color: #2a7; } .fault { color: #c30; }
td.bt { font-weight: 600; } p.stability { margin: 8px 0 2px; }
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def replay_file_name(match_id: int, suffix: str = ".html") -> str:
    """The match's replay beside the page: its player page (.html) or its transcript (.txt)."""
    return f"match-{match_id}{suffix}"


def _charts(board: Leaderboard) -> list[str]:
    from ludus import charts

    parts = []
    colors = charts.player_colors([r.player_id for r in board.rows])  # one colour per entrant in every chart
    tracked = [r for r in board.rows if board.history.get(r.player_id)][:MAX_RATING_LINES]
    if tracked:
        series = []
        for r in tracked:
            points = board.history[r.player_id]
            series.append(charts.Series(
                r.player_id, tuple(p.seq for p in points), tuple(p.mu for p in points),
                lower=tuple(p.mu - INTERVAL_Z * p.sigma for p in points),
                upper=tuple(p.mu + INTERVAL_Z * p.sigma for p in points),
                dashed=r.kind == "bot", markers=len(points) < 30, color=colors[r.player_id]))
        hidden = len([r for r in board.rows if board.history.get(r.player_id)]) - len(tracked)
        chart = charts.line_chart(series, title="TrueSkill mu over the arena's matches (bands: 95% intervals)"
                                  + (f" — {hidden} more not shown" if hidden else ""),
                                  x_label="ledger position (match seq)", y_label="mu")
        parts.append(f'<figure id="fig-ratings">{chart.svg()}<figcaption>Each line is an entrant\'s TrueSkill '
                     f"mean after each of its matches, the band mu &plusmn; 1.96 &sigma;; bots are dashed."
                     f"</figcaption></figure>")
        bars = charts.bar_chart([r.player_id for r in board.rows], [r.mu for r in board.rows],
                                title="Skill estimate mu with its 95% interval, in rank order", y_label="mu",
                                intervals=[r.interval for r in board.rows], value_format="{:.1f}",
                                colors=[colors[r.player_id] for r in board.rows])
        parts.append(f'<figure id="fig-skill">{bars.svg()}<figcaption>Bars: mu; whiskers: mu &plusmn; 1.96 '
                     f"&sigma;. Rank is by mu &minus; 3 &sigma;.</figcaption></figure>")
    else:
        parts.append('<p class="empty" id="fig-ratings-empty">No rated matches yet: run a tournament.</p>')
    h2h = board.head_to_head
    if len(h2h.players) >= 2 and board.total_matches:
        n = len(h2h.players)
        values = [[None if i == j else h2h.score(i, j) for j in range(n)] for i in range(n)]
        tips = [[f"{h2h.players[i]} vs {h2h.players[j]}: " + (
            "never met" if h2h.games(i, j) == 0 else
            f"{h2h.wins[i][j]} W {h2h.draws[i][j]} D {h2h.losses[i][j]} L, score {h2h.score(i, j):.2f}")
            for j in range(n)] for i in range(n)]
        heat = charts.heatmap(list(h2h.players), list(h2h.players), values, tooltips=tips,
                              title="Head-to-head: score of row vs column", x_label="column (opponent)")
        parts.append(f'<figure id="fig-head-to-head">{heat.svg()}<figcaption>Mean outcome of the row entrant '
                     f"against the column entrant (win 1, draw &frac12;, loss 0; forfeits are losses); entrants in "
                     f"rank order. Hover a cell for the counts.</figcaption></figure>")
    return parts


def _leaderboard_table(board: Leaderboard) -> str:
    if not board.rows:
        return '<p class="empty">No entrants yet: submit agents with <code>ludus arena submit</code>.</p>'
    body = []
    for r in board.rows:
        low, high = r.interval
        faults = _faults_text(r.faults)
        bt, span, ranks, rate = _bt_cells(board, r.player_id)
        body.append(f'<tr class="entrant" id="player-{r.rank}" data-player="{_e(r.player_id)}"><td>{r.rank}</td>'
                    f'<td class="name">{_e(r.player_id)}</td><td class="name">{_e(r.kind)} ({_e(r.submission_kind)})'
                    f"</td><td>{r.mu:.2f}</td><td>{r.sigma:.2f}</td><td>{r.conservative:.2f}</td>"
                    f'<td>[{low:.1f}, {high:.1f}]</td><td class="bt">{bt}</td><td>{span}</td><td>{ranks}</td>'
                    f"<td>{r.wins}</td><td>{r.draws}</td><td>{r.losses}</td>"
                    f'<td>{r.games}</td><td class="forfeit-rate">{rate}</td>'
                    f'<td class="name{" fault" if r.faults else ""}">{_e(faults)}</td></tr>')
    return ('<table id="leaderboard"><tr><th>#</th><th class="name">entrant</th><th class="name">kind</th>'
            "<th>mu</th><th>&sigma;</th><th>mu &minus; 3&sigma;</th><th>95% interval</th><th>BT</th>"
            "<th>BT 95% interval</th><th>BT ranks</th><th>W</th><th>D</th>"
            f'<th>L</th><th>games</th><th>forfeit</th><th class="name">forfeits</th></tr>{"".join(body)}</table>')


def ranking_section(board: Leaderboard) -> str:
    """Under the table: the stability figure, what the Bradley-Terry columns are, forfeit rates
    by kind with the ratings without forfeited matches, warnings, and the per-game table."""
    views = board.ranking
    if views is None:
        return '<p class="empty" id="bt-empty">Bradley-Terry: no games between two entrants yet.</p>'
    stale = f" (as of {views.slow_games} games)" if views.stale else ""
    parts = [f'<p class="stability" id="stability"><b>{_e(views.stability_text() + stale)}</b></p>',
             f'<p class="meta" id="bt-note">BT: Bradley-Terry over {views.board.games} games (pairs of seats), '
             f"{_e(TIES)}, on an Elo-like scale (mean 1000); its 95% intervals of rating and rank come from "
             f"{views.rounds} bootstrap rounds (seed {views.seed}){_e(stale)}. Unlike TrueSkill it does not depend on "
             f"the order of the games. forfeit: share of its matches the entrant lost by its own fault."
             + (" The combined board gives every game the same total weight." if views.multi_game else "") + "</p>"]
    rows = [r for r in views.rows() if r["forfeits"]]
    if rows:
        def clean(r: dict) -> str:
            if r["rating_without_forfeits"] is None:
                return "-"
            return f'{r["rating_without_forfeits"]:.0f} (#{r["rank_without_forfeits"]})'

        body = "".join(
            f'<tr><td class="name">{_e(r["player"])}</td><td>{r["forfeit_rate"]:.1%}</td><td>{r["error_rate"]:.1%}</td>'
            f'<td>{r["timeout_rate"]:.1%}</td><td>{r["invalid_rate"]:.1%}</td><td>{r["rating"]:.0f} (#{r["place"]})</td>'
            f"<td>{clean(r)}</td></tr>" for r in rows)
        parts.append('<table id="forfeits"><tr><th class="name">entrant</th><th>forfeit</th><th>error</th>'
                     "<th>timeout</th><th>invalid</th><th>BT (rank)</th><th>BT without forfeited matches (rank)</th>"
                     f"</tr>{body}</table>")
    if views.answers:  # text agents: responses that did not count, retries and refused moves included
        body = "".join(f'<tr><td class="name">{_e(p)}</td><td>{k / t:.1%}</td><td>{k}</td><td>{t}</td></tr>'
                       for p, (t, k) in sorted(views.answers.items()))
        parts.append('<table id="invalid-answers"><tr><th class="name">entrant</th><th>invalid answers</th>'
                     f"<th>invalid</th><th>turns</th></tr>{body}</table>")
    for w in views.warnings:
        parts.append(f'<p class="warning fault">warning: {_e(w.text)}</p>')
    if views.multi_game:
        kinds = [b.game for b in views.per_game]
        head = "".join(f"<th>{_e(k)}</th>" for k in kinds)
        body = "".join(
            f'<tr><td class="name">{_e(r["player"])}</td>' + "".join(
                f'<td>{r["per_game"][k]["rating"]:.0f} ({r["per_game"][k]["games"]})</td>' if k in r["per_game"]
                else "<td>-</td>" for k in kinds) + f'<td>{r["rating"]:.0f}</td></tr>' for r in views.rows())
        parts.append('<h3>Per game</h3><table id="per-game"><tr><th class="name">entrant</th>'
                     f"{head}<th>combined</th></tr>{body}</table><p class=\"meta\">Each game's own Bradley-Terry "
                     "fit (games in brackets); combined: every game the same total weight (as Kaggle's Game "
                     "Arena).</p>")
    return "".join(parts)


def _tournaments_table(board: Leaderboard) -> str:
    if not board.tournaments:
        return '<p class="empty">No tournaments yet.</p>'
    body = "".join(
        f'<tr><td>{t.get("number")}</td><td class="name">{_e(t.get("format"))}</td><td>{t.get("seed")}</td>'
        f'<td>{t.get("games_per_pair")}</td><td>{t.get("matches", 0)}</td>'
        f'<td>{float(t.get("duration_s") or 0.0):.1f}</td><td class="name">{_e(t.get("stopped_because", ""))}</td></tr>'
        for t in board.tournaments)
    return ('<table id="tournaments"><tr><th>#</th><th class="name">format</th><th>seed</th><th>games/pair</th>'
            f'<th>matches</th><th>seconds</th><th class="name">ended</th></tr>{body}</table>')


def _matches_table(board: Leaderboard, replay_dir: str) -> str:
    if not board.recent_matches:
        return '<p class="empty">No matches yet.</p>'
    rank = {r.player_id: r.rank for r in board.rows}
    body = []
    for match in board.recent_matches:
        forfeit = any(s.status != "ok" for s in match.seats)
        seats = []
        for s in match.seats:
            who = _e(s.player_id)
            if s.player_id in rank:
                who = f'<a href="#player-{rank[s.player_id]}">{who}</a>'
            status = ('<span class="status-ok">ok</span>' if s.status == "ok"
                      else f'<span class="fault">{_e(s.status)}: {_e(s.error)}</span>')
            seats.append(f"{who} {s.episode_return:+g} {status}")
        link = f"{urllib.parse.quote(replay_dir)}/{replay_file_name(match.match_id)}"
        body.append(f'<tr class="match{" forfeit" if forfeit else ""}" id="match-{match.match_id}">'
                    f'<td><a href="{_e(link)}">{match.match_id}</a></td>'
                    f'<td>{match.metadata.get("tournament", "")}</td><td>{match.length}</td>'
                    f'<td class="name">{"<br>".join(seats)}</td></tr>')
    more = board.total_matches - len(board.recent_matches)
    note = (f'<p class="meta">{more} older matches not listed (`ludus arena replay MATCH` shows any).</p>'
            if more else "")
    return ('<table id="matches"><tr><th>match</th><th>tournament</th><th>moves</th>'
            f'<th class="name">seats: entrant, return, status</th></tr>{"".join(body)}</table>{note}')


def render_html(board: Leaderboard, replay_dir: str) -> str:
    """The self-contained page; `replay_dir` is the directory (relative to the page) of the replays."""
    from ludus import pages

    forfeits = sum(sum(r.faults.values()) for r in board.rows)
    sections = [
        f"<h1>Ludus arena: {_e(board.game)}</h1>",
        f'<p class="meta" id="summary">{len(board.rows)} entrants &middot; {board.total_matches} matches in '
        f"{len(board.tournaments)} tournament(s) &middot; {forfeits} forfeited seats &middot; TrueSkill "
        f"(&beta; {board.params.beta:.2f}, draw probability {board.params.draw_probability:g}), ranked by "
        f"mu &minus; 3&sigma;</p>",
        '<h2 id="standings">Leaderboard</h2>', _leaderboard_table(board), ranking_section(board),
        '<h2 id="ratings">Ratings</h2>', '<div class="row">', *_charts(board), "</div>",
        '<h2 id="tournaments-title">Tournaments</h2>', _tournaments_table(board),
        '<h2 id="matches-title">Matches</h2>',
        '<p class="meta">Newest first; the match number links to its replay (every board, re-simulated from the '
        "seed and the recorded moves).</p>",
        _matches_table(board, replay_dir),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Ludus arena: {_e(board.game)}</title><style>{pages.PAGE_CSS}{_CSS}</style></head><body>"
            + "\n".join(sections) + "</body></html>\n")


@dataclass(frozen=True)
class PageFiles:
    """What `write_page` wrote."""

    html: str
    replay_dir: str
    replays: int
    """Number of replay transcripts written."""


def write_page(board: Leaderboard, path: str | os.PathLike) -> PageFiles:
    """Write the page and, into ``<stem>_replays/`` beside it, each listed match's replay player
    page (``match-<id>.html``, linked from the page) and its text transcript (``match-<id>.txt``)."""
    from ludus.arena.replay import replay_match
    from ludus.league.records.replay import match_episode
    from ludus.replay_page import replay_html

    page = Path(path)
    page.parent.mkdir(parents=True, exist_ok=True)
    replay_dir = page.parent / f"{page.stem}_replays"
    replay_dir.mkdir(exist_ok=True)
    for match in board.recent_matches:
        (replay_dir / replay_file_name(match.match_id, ".txt")).write_text(replay_match(match).transcript + "\n")
        (replay_dir / replay_file_name(match.match_id)).write_text(
            replay_html(match_episode(match), f"Arena match {match.match_id}",
                        f'<p class="meta"><a href="../{_e(urllib.parse.quote(page.name))}">leaderboard</a> &middot; '
                        f'<a href="{replay_file_name(match.match_id, ".txt")}">transcript</a></p>'))
    page.write_text(render_html(board, replay_dir.name))
    return PageFiles(str(page), str(replay_dir), len(board.recent_matches))
