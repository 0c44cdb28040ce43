"""`ludus report RUN --html FILE`: one self-contained page about a league run, plus PNG plots beside it.

The page shows learning curves from metrics.jsonl (the main agent's rating over env steps and
wall time, the learner's score against each anchor, PPO losses, entropy, KL, throughput, return),
the ratings over time with 95% intervals (from the ledger's ratings history), the
leaderboard (TrueSkill beside Bradley-Terry with 95% bootstrap intervals of rating and rank,
Nash-averaged scores, the rank-stability figure, forfeit rates; `ludus.league.records.ranking` over the games
between frozen members that `ludus ratings` reads), the empirical payoff heatmap, the meta-game (Nash mixture, alpha-rank, 3-cycles), the
snapshot genealogy (parents and roles from the population), the exploitability curve where the run
logged ``eval/exploitability`` in metrics.jsonl, and the matchmaking mix (whom each learner trained
against), and for team games the results of each side and of each member on it. Charts are inline SVG from ludus/charts.py; the page has no scripts and no external
``src``/``href``, so it opens anywhere, offline. The same charts are written as PNG files into
``<FILE stem>_png/`` beside it (matplotlib).

Building the report only reads the run directory, so it works while the run trains.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ludus import charts, pages
from ludus.evaluation.metagame import MetaGameReport, PayoffMatrix, PayoffRecorder, solve_metagame
from ludus.league.records.population import Member
from ludus.league.records.ranking import TIES, RankingError, RankingViews, ledger_records, ranking_views
from ludus.league.records.ratings import Rating
from ludus.league.status import GameStatus, game_statuses

MAX_HEATMAP_PLAYERS = 40
"""Payoff heatmap size limit: anchors plus the newest members."""
MAX_RATING_LINES = 10
"""Ratings chart: anchors plus the best snapshots by mu - 3 sigma with bands, up to this many; the
other members are thin lines."""
MIN_CELL_GAMES = 10
"""Payoff heatmap cells resting on fewer games are drawn pale."""
MAX_POINTS_PER_LINE = 400
"""Ratings history points kept per player (evenly spaced, last one kept)."""
INTERVAL_Z = 1.96
"""Rating bands are mu +- 1.96 sigma: the 95% interval of the skill belief."""


@dataclass(frozen=True)
class RatingTrack:
    """One player's ratings history."""

    player_id: str
    seq: tuple[int, ...]
    """Ledger seq of the match that produced each entry."""
    mu: tuple[float, ...]
    sigma: tuple[float, ...]


@dataclass(frozen=True)
class MatchmakingMix:
    """Training games of each learner per opponent."""

    learners: tuple[str, ...]
    opponents: tuple[str, ...]
    """'self-play' first, then opponents in population order."""
    counts: np.ndarray
    """[learners, opponents] training games in which the learner met the opponent (self-play: the
    learner on both sides)."""


@dataclass(frozen=True)
class SideResult:
    """A member's games on one side of a team game (a match counts once, however many seats it held)."""

    player_id: str
    side: int
    """Index of the side (team) in order of first seat."""
    games: int
    wins: int
    draws: int
    losses: int
    mean_return: float
    """Mean over its games of the side's mean seat return."""


@dataclass(frozen=True)
class RunReport:
    """Everything the page shows, read from one run directory."""

    run_dir: str
    game_id: str
    iteration: int
    iterations: int
    total_matches: int
    total_env_steps: int
    matches_by_kind: Mapping[str, int]
    members: tuple[Member, ...]
    learner_snapshots: Mapping[str, str | None]
    ratings: Mapping[str, Rating]
    """Latest stored rating per rated member."""
    tracks: tuple[RatingTrack, ...]
    payoff: PayoffMatrix
    """Head-to-head record of frozen members and learners over training, rating and evaluation matches."""
    metagame: MetaGameReport | None
    """Meta-game of the frozen members that played; None with fewer than two of them."""
    exploitability: tuple[tuple[float, float], ...]
    """(env steps, exploitability) from metrics.jsonl's ``eval/exploitability`` entries."""
    matchmaking: MatchmakingMix
    curves: Mapping[str, tuple[tuple[float, float, float], ...]] = field(default_factory=dict)
    """metrics.jsonl series for the learning curves: key -> ((env steps, wall seconds, value), ...)."""
    sides: tuple[tuple[int, ...], ...] = ()
    """Seats of each side of the game (spec.sides)."""
    side_results: tuple[SideResult, ...] = ()
    """Per member and side over training, rating and evaluation matches; empty unless the game
    has teams (a side of several seats)."""
    ranking: RankingViews | None = None
    """Bradley-Terry and the other order-free views of the frozen members (None: no games between two)."""
    games: tuple[GameStatus, ...] = ()
    """A run of several games: each game's TrueSkill, games, score and invalid answers per turn."""

    @property
    def is_team_game(self) -> bool:
        return any(len(side) > 1 for side in self.sides)


# ---------------------------------------------------------------------------------------------
# Reading a run


CURVE_PREFIXES = ("league/main_mu", "eval/win_rate_vs_", "losses/", "charts/steps_per_second",
                  "charts/episodic_return", "eval/exploitability")
"""metrics.jsonl keys (or key prefixes) the learning curves read."""


def read_curves(run_dir: Path, prefixes: Sequence[str] = CURVE_PREFIXES) -> dict[str, tuple[tuple[float, float, float], ...]]:
    """Every metrics.jsonl series whose key starts with one of `prefixes`, as (env steps, wall
    seconds, value) points; wall seconds sum the iterations' ``charts/iteration_seconds`` (training
    time, pauses and resumes excluded). One pass over the file; a last line without its newline
    is being written and is left out."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    out: dict[str, list[tuple[float, float, float]]] = {}
    wall = 0.0
    for line in path.read_text().split("\n")[:-1]:
        if not line.strip():
            continue
        record = json.loads(line)
        wall += float(record.get("charts/iteration_seconds", 0.0))
        step = float(record.get("step", 0.0))
        for key, value in record.items():
            if key != "step" and key.startswith(tuple(prefixes)):
                out.setdefault(key, []).append((step, wall, float(value)))
    return {key: tuple(points) for key, points in out.items()}


def build_report(run_dir: str | os.PathLike) -> RunReport:
    """Read everything the report shows (read-only)."""
    from ludus.games.registry import spec as game_spec
    from ludus.league.rundata import open_ledger, read_run

    run = read_run(run_dir)
    spec = game_spec(run.game_id)
    sides = spec.sides
    team_game = any(len(side) > 1 for side in sides)
    side_of_team = {spec.team_of_seat[side[0]]: index for index, side in enumerate(sides)}
    side_totals: dict[tuple[str, int], list[float]] = {}
    learners = [m.player_id for m in run.members if m.kind == "learner"]
    frozen = [m.player_id for m in run.members if m.kind != "learner"]
    learner_set = set(learners)
    mix_counts: dict[tuple[str, str], int] = {}
    kinds: dict[str, int] = {}
    record = PayoffRecorder(frozen + learners)
    ranked = []  # the matches `ludus ratings` reads (ludus.league.api.RANKED_KINDS)
    with open_ledger(run.run_dir) as store:
        for recorded in store.iter_matches():
            match = recorded.result
            kinds[match.kind] = kinds.get(match.kind, 0) + 1
            if match.kind in ("training", "rating", "evaluation"):
                record.add(match)
                ranked.append(match)
                if team_game:
                    _add_side_results(side_totals, match, side_of_team)
            if match.kind == "training":
                # One count per (learner, opponent) per game, however many seats each holds.
                pairs = {(seat.player_id, "self-play" if other.player_id == seat.player_id else other.player_id)
                         for seat in match.seats if seat.player_id in learner_set
                         for other in match.seats if other.team != seat.team}
                for pair in pairs:
                    mix_counts[pair] = mix_counts.get(pair, 0) + 1
        history = store.ratings_history()
        latest = store.latest_ratings()
        per_game = game_statuses(store, run.game_id)
    payoff = record.matrix()

    per_player: dict[str, list[tuple[int, float, float]]] = {}
    for record in history:
        per_player.setdefault(record.player_id, []).append((record.seq, record.mu, record.sigma))
    tracks = []
    for player_id, points in per_player.items():
        if len(points) > MAX_POINTS_PER_LINE:
            keep = np.unique(np.linspace(0, len(points) - 1, MAX_POINTS_PER_LINE).round().astype(int))
            points = [points[i] for i in keep]
        seq, mu, sigma = zip(*points)
        tracks.append(RatingTrack(player_id, seq, mu, sigma))

    # Meta-game over frozen members that played at least one game against another frozen member.
    frozen_record = payoff.subset(frozen)
    played = [p for p, n in zip(frozen, frozen_record.games.sum(axis=1)) if n > 0]
    metagame = solve_metagame(frozen_record.subset(played)) if len(played) >= 2 else None

    opponents = [o for o in ("self-play", *frozen, *learners) if any((l, o) in mix_counts for l in learners)]
    counts = np.array([[mix_counts.get((l, o), 0) for o in opponents] for l in learners], dtype=np.int64)
    curves = read_curves(run.run_dir)  # one pass over metrics.jsonl serves the curves and the exploitability
    records = ledger_records(ranked, frozen)
    try:
        ranking = ranking_views(records) if records.games else None
    except RankingError:
        ranking = None
    return RunReport(
        run_dir=str(run.run_dir), game_id=run.game_id, iteration=run.iteration,
        iterations=int(run.config.get("iterations", run.iteration)), total_matches=run.total_matches,
        total_env_steps=run.total_env_steps, matches_by_kind=kinds, members=run.members,
        learner_snapshots=dict(run.learner_snapshots),
        ratings={pid: Rating(r.mu, r.sigma) for pid, r in latest.items()}, tracks=tuple(tracks), payoff=payoff,
        metagame=metagame, curves=curves,
        exploitability=tuple((step, value) for step, _, value in curves.get("eval/exploitability", ())),
        matchmaking=MatchmakingMix(tuple(learners), tuple(opponents), counts.reshape(len(learners), len(opponents))),
        sides=sides, side_results=tuple(
            SideResult(pid, side, int(t[0]), int(t[1]), int(t[2]), int(t[3]), t[4] / t[0])
            for (pid, side), t in sorted(side_totals.items(), key=lambda kv: (kv[0][1], kv[0][0]))),
        ranking=ranking, games=per_game)


def _add_side_results(totals: dict[tuple[str, int], list[float]], match, side_of_team: Mapping[int, int]) -> None:
    """Count one match into [games, wins, draws, losses, return sum] per (player, side)."""
    seats: dict[tuple[str, int], list] = {}
    for seat in match.seats:
        seats.setdefault((seat.player_id, side_of_team.get(seat.team, seat.team)), []).append(seat)
    for (player_id, side), held in seats.items():
        if len({s for p, s in seats if p == player_id}) > 1:
            continue  # the learner on both sides (self-play) says nothing about a side
        outcome = held[0].outcome
        t = totals.setdefault((player_id, side), [0, 0, 0, 0, 0.0])
        t[0] += 1
        t[1] += outcome == 1.0
        t[2] += outcome == 0.5
        t[3] += outcome == 0.0
        t[4] += float(np.mean([s.episode_return for s in held]))


# ---------------------------------------------------------------------------------------------
# Charts


def _member_kind(report: RunReport) -> dict[str, str]:
    return {m.player_id: m.kind for m in report.members}


def player_colors(report: RunReport) -> dict[str, str]:
    """The page's colour of each member (`charts.player_colors`, in the members' order): the same
    member in the same colour in the ratings, Bradley-Terry and meta-game charts."""
    return charts.player_colors([m.player_id for m in report.members] + [t.player_id for t in report.tracks])


def ratings_chart(report: RunReport) -> charts.Chart | None:
    """mu over the ledger: the anchors and the best snapshots with their 95% bands, and every
    other rated member as a thin pale line (the early snapshots are where learning shows)."""
    if not report.tracks:
        return None
    kind = _member_kind(report)
    anchors = [t for t in report.tracks if kind.get(t.player_id) == "anchor"]
    others = sorted((t for t in report.tracks if kind.get(t.player_id) != "anchor"),
                    key=lambda t: -(t.mu[-1] - 3 * t.sigma[-1]))
    best = others[:max(MAX_RATING_LINES - len(anchors), 1)]
    rest = sorted(others[len(best):], key=lambda t: t.seq[0])

    def series(t: RatingTrack, thin: bool) -> charts.Series:
        band = {} if thin else {"lower": tuple(m - INTERVAL_Z * s for m, s in zip(t.mu, t.sigma)),
                                "upper": tuple(m + INTERVAL_Z * s for m, s in zip(t.mu, t.sigma))}
        return charts.Series(t.player_id, t.seq, t.mu, dashed=kind.get(t.player_id) == "anchor",
                             markers=not thin and len(t.seq) < 30, thin=thin,
                             color="#9A9A9A" if thin else colors[t.player_id], **band)

    colors = player_colors(report)

    title = "TrueSkill mu over the ledger (bands: 95% intervals)" + (
        f"; thin grey: the other {len(rest)} members" if rest else "")
    return charts.line_chart([series(t, False) for t in anchors + best] + [series(t, True) for t in rest],
                             title=title, x_label="ledger position (match seq)", y_label="mu")


def learning_charts(report: RunReport) -> list[tuple[str, charts.Chart, str]]:
    """Small multiples of the run's learning: (figure id, chart, caption) for each series group
    metrics.jsonl holds."""
    curves = report.curves
    main = next((m.player_id for m in report.members if m.kind == "learner"), None)
    out = []

    def chart(fig_id: str, keys: list[str], title: str, y_label: str, caption: str, wall: bool = False,
              names: Sequence[str] | None = None, y_range: tuple[float, float] | None = None) -> None:
        keys = [k for k in keys if k in curves]
        if not keys:
            return
        series = [charts.Series(name, [p[1 if wall else 0] for p in curves[k]], [p[2] for p in curves[k]])
                  for k, name in zip(keys, names or keys)]
        out.append((fig_id, charts.line_chart(series, title=title, x_label="training seconds" if wall else "env steps",
                                              y_label=y_label, width=460, height=260, y_range=y_range), caption))

    chart("fig-main-rating", ["league/main_mu"], "Main agent's rating (newest snapshot)", "mu",
          "TrueSkill mu of the main role's newest snapshot at each iteration, over env steps.", names=["main mu"])
    chart("fig-main-rating-wall", ["league/main_mu"], "Main agent's rating over wall time", "mu",
          "The same over training time (the sum of the iterations' wall times).", wall=True, names=["main mu"])
    anchors = sorted(k for k in curves if k.startswith("eval/win_rate_vs_"))
    chart("fig-win-rates", anchors, "Main learner's score against each anchor", "score (win 1, draw 1/2)",
          "The learner's recent games against each anchor (the payoff table's decayed counts).",
          names=[k[len("eval/win_rate_vs_"):] for k in anchors], y_range=(0.0, 1.0))
    if main is not None:
        prefix = f"losses/{main}/"
        chart("fig-losses", [prefix + k for k in ("policy_loss", "value_loss")], f"PPO losses of {main}", "loss",
              "Clipped policy loss and value loss of each update.", names=["policy", "value"])
        chart("fig-entropy", [prefix + "entropy"], f"Policy entropy of {main}", "nats",
              "Mean entropy of the learner's policy on its batch.", names=["entropy"])
        chart("fig-kl", [prefix + "approx_kl"], f"Approximate KL per update of {main}", "KL",
              "KL between the policy before and after each update (Schulman's k3 estimator).", names=["approx KL"])
    chart("fig-throughput", ["charts/steps_per_second"], "Throughput", "env steps / s",
          "Env steps per second of each iteration, over training time.", wall=True, names=["steps/s"])
    chart("fig-return", ["charts/episodic_return"], "Learner's episodic return", "return",
          "Mean return of the learner's finished games in each iteration.", names=["return"])
    return out


def _heatmap_players(report: RunReport) -> list[str]:
    players = list(report.payoff.players)
    played = {p for p, n in zip(players, report.payoff.games.sum(axis=1)) if n > 0}
    players = [p for p in players if p in played]
    if len(players) <= MAX_HEATMAP_PLAYERS:
        return players
    kind = _member_kind(report)
    fixed = [p for p in players if kind.get(p) in ("anchor", "learner")]
    rest = [p for p in players if p not in fixed]
    return fixed + rest[-(MAX_HEATMAP_PLAYERS - len(fixed)):]


def payoff_chart(report: RunReport) -> charts.Chart | None:
    players = _heatmap_players(report)
    if len(players) < 2:
        return None
    record = report.payoff.subset(players)
    score, games = record.score, record.games
    kind = _member_kind(report)
    labels = [f"{p} (live)" if kind.get(p) == "learner" else p for p in players]
    values = [[None if np.isnan(v) else float(v) for v in row] for row in score]
    tips = [[f"{labels[i]} vs {labels[j]}: " + ("never met" if games[i, j] == 0 else
                                                f"score {score[i, j]:.3f} over {int(games[i, j])} games")
             for j in range(len(players))] for i in range(len(players))]
    return charts.heatmap(labels, labels, values, title="Payoff: mean score of row vs column (games)", tooltips=tips,
                          x_label="column (opponent)", counts=games.astype(int).tolist(), min_count=MIN_CELL_GAMES)


def metagame_charts(meta: MetaGameReport,
                    colors: Mapping[str, str] | None = None) -> tuple[charts.Chart, charts.Chart]:
    """The Nash mixture and alpha-rank bars, each member in its page colour (`colors`; default: by
    the meta-game's order)."""
    colors = colors if colors is not None else charts.player_colors(meta.players)
    bars = [colors.get(p, charts.color_of(0)) for p in meta.players]
    nash = charts.bar_chart(list(meta.players), list(meta.nash), title="Meta-game Nash mixture",
                            y_label="probability", value_range=(0.0, 1.0), value_format="{:.2f}", colors=bars)
    rank = charts.bar_chart(list(meta.players), list(meta.alpharank), title="alpha-rank stationary distribution",
                            y_label="mass", value_range=(0.0, 1.0), value_format="{:.2f}", colors=bars)
    return nash, rank


def genealogy_chart(report: RunReport) -> charts.Chart:
    nodes = []
    for m in report.members:
        rating = report.ratings.get(m.player_id)
        rating_text = f"mu {rating.mu:.1f} sigma {rating.sigma:.1f}" if rating else "not rated"
        if m.kind == "learner":
            parent, time, group = report.learner_snapshots.get(m.player_id), float(report.iteration), m.role
            detail = f"live learner at iteration {report.iteration}"
            label = f"{m.player_id} (live)"
        else:
            parent, time = m.parent, float(m.iteration)
            group = "anchor" if m.kind == "anchor" else m.role
            detail = (f"{m.kind}, joined at iteration {m.iteration}, {m.steps:,} steps, {rating_text}"
                      + (f", snapshot {m.snapshot_id[:12]}" if m.snapshot_id else "")
                      + (f", bot {m.bot}" if m.bot else ""))
            label = m.player_id
        nodes.append(charts.TreeNode(m.player_id, parent, label=label, group=group, time=time, detail=detail))
    return charts.lineage_tree(nodes, title="Genealogy: snapshots by iteration, lines from parent to child",
                               x_label="iteration")


def exploitability_chart(report: RunReport) -> charts.Chart | None:
    if not report.exploitability:
        return None
    steps, values = zip(*report.exploitability)
    return charts.line_chart([charts.Series("exploitability", steps, values, markers=len(steps) < 40)],
                             title="Exploitability of the league's output policy", x_label="env steps",
                             y_label="exploitability", reference=[(0.0, "Nash")])


def matchmaking_chart(report: RunReport) -> charts.Chart | None:
    mix = report.matchmaking
    if not mix.learners or not mix.opponents:
        return None
    values = [[float(c) for c in row] for row in mix.counts]
    high = float(mix.counts.max()) if mix.counts.size else 1.0
    tips = [[f"{l} trained against {o}: {int(c)} games" for o, c in zip(mix.opponents, row)]
            for l, row in zip(mix.learners, mix.counts)]
    return charts.heatmap(list(mix.learners), list(mix.opponents), values, title="Matchmaking mix: training games",
                          low=0.0, high=max(high, 1.0), scale="sequential", value_format="{:.0f}", tooltips=tips,
                          x_label="opponent")


# ---------------------------------------------------------------------------------------------
# The page

_CSS = pages.PAGE_CSS


def _e(text: object) -> str:
    return html.escape(str(text))


def _figure(chart: charts.Chart | None, fig_id: str, caption: str, empty: str) -> str:
    if chart is None:
        return f'<p class="empty" id="{fig_id}-empty">{_e(empty)}</p>'
    return f'<figure id="{fig_id}">{chart.svg()}<figcaption>{_e(caption)}</figcaption></figure>'


def bt_chart(report: RunReport) -> charts.Chart | None:
    """Bradley-Terry ratings with their 95% bootstrap intervals, best first."""
    views = report.ranking
    if views is None or views.intervals is None:
        return None
    rows = views.rows()
    colors = player_colors(report)
    return charts.bar_chart([r["player"] for r in rows], [r["rating"] for r in rows],
                            colors=[colors.get(r["player"], charts.color_of(0)) for r in rows],
                            title="Bradley-Terry rating with its 95% bootstrap interval", y_label="rating (mean 1000)",
                            intervals=[(r["low"], r["high"]) for r in rows], value_format="{:.0f}",
                            reference=1000.0)


def _leaderboard(report: RunReport) -> str:
    """TrueSkill (as the run rated) beside Bradley-Terry with its intervals, Nash-averaged score and
    forfeit rate, best Bradley-Terry first, then the stability figure and the forfeit views."""
    views = report.ranking
    if not report.ratings and views is None:
        return '<p class="empty">No rating matches yet.</p>'
    kind = _member_kind(report)
    bt = {r["player"]: r for r in views.rows()} if views is not None else {}
    order = list(bt) + [p for p, _ in sorted(report.ratings.items(), key=lambda kv: -kv[1].conservative)
                        if p not in bt]

    def cells(pid: str) -> str:
        r, t = bt.get(pid), report.ratings.get(pid)
        ts = (f"<td>{t.mu:.2f}</td><td>{t.sigma:.2f}</td><td>{t.conservative:.2f}</td>" if t is not None
              else "<td>-</td>" * 3)
        if r is None:
            return ts + "<td>-</td>" * 6
        span = "-" if r["low"] is None else f'[{r["low"]:.0f}, {r["high"]:.0f}]'
        ranks = "-" if r["rank_low"] is None else f'{r["rank_low"]}-{r["rank_high"]}'
        nash = "-" if r["nash"] is None else f'{r["nash"]:+.3f}'
        rate = "-" if r["forfeit_rate"] is None else f'{r["forfeit_rate"]:.1%}'
        return ts + (f'<td class="bt"><b>{r["rating"]:.0f}</b></td><td>{span}</td><td>{ranks}</td><td>{nash}</td>'
                     f'<td>{r["games"]}</td><td>{rate}</td>')

    body = "".join(f'<tr><td>{i}</td><td class="name">{_e(pid)}</td><td class="name">{_e(kind.get(pid, "?"))}</td>'
                   f"{cells(pid)}</tr>" for i, pid in enumerate(order, 1))
    parts = ['<table id="leaderboard"><tr><th>#</th><th class="name">player</th><th class="name">kind</th>'
             "<th>mu</th><th>sigma</th><th>mu-3&sigma;</th><th>BT</th><th>BT 95% interval</th><th>BT ranks</th>"
             f"<th>Nash avg.</th><th>BT games</th><th>forfeit</th></tr>{body}</table>"]
    if views is not None:
        parts.append(f'<p class="stability" id="stability"><b>{_e(views.stability_text())}</b></p>')
        parts.append(f'<p class="meta" id="bt-note">BT: Bradley-Terry over {views.board.games:,} games between '
                     f"frozen members in the training, rating and evaluation matches (live learners left out), "
                     f"{_e(TIES)}, Elo-like scale (mean 1000); 95% intervals of rating and rank from {views.rounds} "
                     f"bootstrap rounds (seed {views.seed}). Nash avg.: score against the maximum-entropy Nash "
                     f"mixture of the meta-game (0 for members of its support; pairs that never met count as even). "
                     f"TrueSkill is the run's own online rating (rating matches, in order); rows are in "
                     f"Bradley-Terry order.</p>")
        if views.without_forfeits is not None:
            clean = views.without_forfeits
            parts.append('<p class="meta" id="bt-clean">Bradley-Terry without forfeited matches: ' + ", ".join(
                f"{_e(clean.players[i])} {clean.rating[i]:.0f}" for i in clean.order()) + "</p>")
        if views.answers:
            body = "".join(f'<tr><td class="name">{_e(p)}</td><td>{k / t:.2f}</td><td>{k}</td><td>{t}</td></tr>'
                           for p, (t, k) in sorted(views.answers.items()))
            parts.append('<table id="invalid-answers"><tr><th class="name">text agent</th><th>invalid answers per turn</th>'
                         f"<th>invalid</th><th>turns</th></tr>{body}</table>")
        parts += [f'<p class="warning">warning: {_e(w.text)}</p>' for w in views.warnings]
        if views.multi_game:
            kinds = [b.game for b in views.per_game]
            rows = "".join(f'<tr><td class="name">{_e(r["player"])}</td>' + "".join(
                f'<td>{r["per_game"][k]["rating"]:.0f} ({r["per_game"][k]["games"]})</td>' if k in r["per_game"]
                else "<td>-</td>" for k in kinds) + f'<td>{r["rating"]:.0f}</td></tr>' for r in views.rows())
            parts.append('<table id="per-game"><tr><th class="name">player</th>'
                         + "".join(f"<th>{_e(k)}</th>" for k in kinds) + f"<th>combined</th></tr>{rows}</table>")
        parts.append(_figure(bt_chart(report), "fig-bt", "Bars: Bradley-Terry rating; whiskers: 95% bootstrap "
                             "interval; dashed: the mean, 1000.", ""))
    return "".join(parts)


def _games_section(report: RunReport) -> str:
    """A run of several games: one table per game (TrueSkill from that game's rating matches)."""
    parts = []
    for game in report.games:
        rows = "".join(
            f'<tr><td class="name">{_e(m.player_id)}</td>'
            + ("<td>-</td>" * 3 if m.mu is None else f"<td>{m.mu:.2f}</td><td>{m.sigma:.2f}</td><td>{m.conservative:.2f}</td>")
            + f"<td>{m.games:,}</td><td>{m.score:.3f}</td>"
            + ("<td>-</td>" if m.invalid_answers is None else f"<td>{m.invalid_answers:.2f}</td>") + "</tr>"
            for m in game.members)
        parts.append(f'<h3>{_e(game.game)}: {game.matches:,} matches</h3><table class="game"><tr>'
                     '<th class="name">player</th><th>mu</th><th>sigma</th><th>mu-3&sigma;</th><th>games</th>'
                     f"<th>score</th><th>invalid answers per turn</th></tr>{rows}</table>")
    return "".join(parts)


def _teams_section(report: RunReport) -> str:
    """Per side: its seats and results; per member: its results on each side it played."""
    if not report.side_results:
        return '<p class="empty" id="teams-empty">No games between sides recorded yet.</p>'
    parts = []
    for index, seats in enumerate(report.sides):
        rows = [r for r in report.side_results if r.side == index]
        games = sum(r.games for r in rows)
        if games == 0:
            continue
        wins, draws, losses = (sum(getattr(r, k) for r in rows) for k in ("wins", "draws", "losses"))
        mean = sum(r.mean_return * r.games for r in rows) / games
        body = "".join(
            f'<tr><td class="name">{_e(r.player_id)}</td><td>{r.games:,}</td><td>{r.wins:,}</td><td>{r.draws:,}</td>'
            f"<td>{r.losses:,}</td><td>{r.wins / r.games:.3f}</td><td>{r.mean_return:.3g}</td></tr>"
            for r in sorted(rows, key=lambda r: -r.games))
        parts.append(
            f'<h3>Side {index} (seats {", ".join(map(str, seats))}): {games:,} games, {wins:,} won, {draws:,} drawn, '
            f'{losses:,} lost, mean return {mean:.3g}</h3><table class="side" id="side-{index}"><tr>'
            '<th class="name">member</th><th>games</th><th>W</th><th>D</th><th>L</th><th>win rate</th>'
            f"<th>mean return</th></tr>{body}</table>")
    return "".join(parts)


def _learning_section(report: RunReport) -> str:
    found = learning_charts(report)
    if not found:
        return '<p class="empty" id="learning-empty">metrics.jsonl holds no iterations yet.</p>'
    return '<div class="row">' + "".join(_figure(c, fig_id, caption, "") for fig_id, c, caption in found) + "</div>"


def _metagame_section(meta: MetaGameReport | None, colors: Mapping[str, str]) -> str:
    if meta is None:
        return '<p class="empty" id="metagame-empty">Fewer than two frozen members have played each other yet.</p>'
    nash, rank = metagame_charts(meta, colors)
    parts = ['<div class="row">',
             _figure(nash, "fig-nash", "Maximin mixture of the zero-sum meta-game 2P-1 (symmetric Nash).", ""),
             _figure(rank, "fig-alpharank", "alpha-rank (alpha=100, population 50): where evolution spends its time.",
                     ""), "</div>"]
    if meta.unplayed_pairs:
        parts.append(f"<p class=\"meta\">{meta.unplayed_pairs} pair(s) never met and enter at 0.5 "
                     f"(Beta(1,1) prior).</p>")
    if meta.cycles:
        rows = "".join(
            f'<tr><td class="name">{_e(c.players[0])} &gt; {_e(c.players[1])} &gt; {_e(c.players[2])} &gt; '
            f"{_e(c.players[0])}</td><td>{c.scores[0]:.2f}</td><td>{c.scores[1]:.2f}</td><td>{c.scores[2]:.2f}</td>"
            f"<td>{c.margin:.2f}</td></tr>" for c in meta.cycles)
        parts.append(f"<p>{meta.num_cycles} non-transitive 3-cycle(s) among played pairs"
                     + (f" (strongest {len(meta.cycles)} listed)" if meta.num_cycles > len(meta.cycles) else "")
                     + ':</p><table id="cycles"><tr><th class="name">cycle</th><th>A vs B</th><th>B vs C</th>'
                       f"<th>C vs A</th><th>margin</th></tr>{rows}</table>")
    else:
        parts.append('<p id="cycles-none">No 3-cycles among played pairs: the results so far are transitive.</p>')
    return "".join(parts)


def render_html(report: RunReport, png_dir_name: str | None = None) -> str:
    """The self-contained page (no scripts, no external src/href)."""
    kinds = ", ".join(f"{n:,} {k}" for k, n in sorted(report.matches_by_kind.items())) or "no matches"
    run_name = Path(report.run_dir).name
    sections = [
        f"<h1>Ludus league report: {_e(run_name)}</h1>",
        f'<p class="meta" id="summary">game <b>{_e(report.game_id)}</b> &middot; iteration {report.iteration} of '
        f"{report.iterations} &middot; {report.total_env_steps:,} env steps &middot; ledger: {_e(kinds)} &middot; "
        f"{len(report.members)} members</p>",
        '<h2 id="learning">Learning curves</h2>', _learning_section(report),
        '<h2 id="ratings">Ratings over time</h2>',
        _figure(ratings_chart(report), "fig-ratings",
                "Each line is a frozen member's TrueSkill mean after each of its rating matches; the band is "
                "mu +- 1.96 sigma. Anchors are dashed.", "No rating matches yet."),
        '<h2 id="leaderboard-title">Leaderboard</h2>', _leaderboard(report),
        *(['<h2 id="games">Per game</h2>', '<p class="meta">This run plays several games; each match is one of '
            "them, drawn from its seed. TrueSkill here is rebuilt from each game's own rating matches; games, score "
            "and the share of a text agent's answers that did not count are over all its matches of that game.</p>",
            _games_section(report)] if report.games else []),
        '<h2 id="payoff">Payoff</h2>',
        _figure(payoff_chart(report), "fig-payoff",
                "Mean outcome (win 1, draw 0.5, loss 0) of the row player against the column player over training, "
                f"rating and evaluation matches, with the number of games under it (or on hover in large "
                f"tables); cells resting on fewer than {MIN_CELL_GAMES} games are pale. Live learners mix all "
                "their versions.", "Not enough games between members yet."),
        *(['<h2 id="teams">Teams</h2>', '<p class="meta">Training, rating and evaluation games of each side '
            "and of each member on it (a match counts once for a member, however many of its side's seats it "
            "held; the side's return is the mean of its seats').</p>", _teams_section(report)]
          if report.is_team_game else []),
        '<h2 id="metagame">Meta-game</h2>', _metagame_section(report.metagame, player_colors(report)),
        '<h2 id="genealogy">Genealogy</h2>',
        _figure(genealogy_chart(report), "fig-genealogy",
                "Members by the iteration they joined, coloured by role; a line joins each snapshot to the one "
                "its learner was frozen from before it. Hover a node for its details.", ""),
        '<h2 id="exploitability">Exploitability</h2>',
        _figure(exploitability_chart(report), "fig-exploitability",
                "NashConv / 2 of the main agent's policy as logged by the run (eval/exploitability).",
                "This run logged no exploitability (it is measured exactly only for small OpenSpiel games "
                "such as Kuhn and Leduc poker)."),
        '<h2 id="matchmaking">Matchmaking mix</h2>',
        _figure(matchmaking_chart(report), "fig-matchmaking",
                "Training games of each learner by opponent (self-play, snapshots, anchors).",
                "No training matches with opponents yet."),
    ]
    if png_dir_name:
        sections.append(f'<p class="meta" id="png-note">PNG copies of these charts: {_e(png_dir_name)}/</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Ludus report: {_e(run_name)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(sections) + "</body></html>\n")


def report_charts(report: RunReport) -> dict[str, charts.Chart]:
    """The page's charts by file stem (those with data)."""
    found: dict[str, charts.Chart | None] = {
        "ratings": ratings_chart(report), "payoff": payoff_chart(report), "genealogy": genealogy_chart(report),
        "exploitability": exploitability_chart(report), "matchmaking": matchmaking_chart(report),
        "bradley_terry": bt_chart(report)}
    if report.metagame is not None:
        found["nash"], found["alpharank"] = metagame_charts(report.metagame, player_colors(report))
    for fig_id, chart, _ in learning_charts(report):
        found[fig_id.removeprefix("fig-")] = chart
    return {name: chart for name, chart in found.items() if chart is not None}


@dataclass(frozen=True)
class ReportFiles:
    html: str
    pngs: tuple[str, ...]


def write_report(run_dir: str | os.PathLike, html_path: str | os.PathLike, png: bool = True) -> ReportFiles:
    """Write the page (and, with `png`, its charts as PNG files into ``<stem>_png/`` beside it)."""
    report = build_report(run_dir)
    html_path = Path(html_path)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    png_dir = html_path.parent / f"{html_path.stem}_png"
    pngs: list[str] = []
    if png:
        png_dir.mkdir(exist_ok=True)
        for name, chart in report_charts(report).items():
            path = png_dir / f"{name}.png"
            chart.png(str(path))
            pngs.append(str(path))
    html_path.write_text(render_html(report, png_dir.name if png else None))
    return ReportFiles(str(html_path), tuple(pngs))


def format_files(files: ReportFiles) -> list[str]:
    return [f"wrote {files.html}"] + ([f"wrote {len(files.pngs)} PNG plots in {Path(files.pngs[0]).parent}"]
                                      if files.pngs else [])
