"""The rating views of league/records/ranking.py wired into the product (issue 78): ledger matches as
games, `ludus ratings`, the arena's leaderboard (text, JSON, pages, the service's cache), several
games on one ledger, the status table's per-anchor columns and exploitability, the report."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ludus.league.records.ledger import MatchResult, SeatResult, Store, outcomes_from_returns
from ludus.league.records.ranking import (Game, LedgerRecords, bootstrap_intervals, fit, format_views, ledger_records,
                            ranking_views)

GAME = "tic_tac_toe"


def match(match_id: int, players, returns, teams=None, statuses=None, kind="arena", game=GAME) -> MatchResult:
    teams = list(teams) if teams is not None else list(range(len(players)))
    statuses = statuses or ["ok"] * len(players)
    outcomes = outcomes_from_returns(returns, teams)
    seats = tuple(SeatResult(seat=i, team=t, player_id=p, episode_return=float(r), outcome=o, status=s,
                             error="" if s == "ok" else "synthetic")
                  for i, (p, t, r, o, s) in enumerate(zip(players, teams, returns, outcomes, statuses)))
    return MatchResult(match_id=match_id, kind=kind, game_id=game, seed=match_id, seats=seats, length=5,
                       started_at=0.0, duration_s=0.0, metadata={"tournament": 1})


# ------------------------------------------------------------------------------ ledger -> records


def test_ledger_records_pair_like_the_payoff_table_and_blame_the_faulty_seat():
    matches = [
        match(0, ["a", "b"], [1, -1]),
        match(1, ["a", "b"], [0, 0]),
        match(2, ["a", "b"], [-1, 1], statuses=["timeout", "ok"]),  # a forfeits
        match(3, ["a", "b"], [0, 0], statuses=["error", "invalid"]),  # nobody played: no result
        # a team game: two seats a side; cross-team pairs only, a player's own team never
        match(4, ["a", "c", "b", "d"], [1, 1, -1, -1], teams=[0, 0, 1, 1], statuses=["ok", "ok", "invalid", "ok"]),
        match(5, ["a", "x"], [1, -1]),  # x is not listed below
    ]
    records = ledger_records(matches, players=["a", "b", "c", "d"])
    assert [(g.a, g.b, g.score_a) for g in records.games] == [
        ("a", "b", 1.0), ("a", "b", 0.5), ("a", "b", 0.0),
        ("a", "b", 1.0), ("a", "d", 1.0), ("c", "b", 1.0), ("c", "d", 1.0)]
    assert records.skipped == 2  # every seat failed; no pair of listed players
    assert [(m.status, m.faulty) for m in records.matches] == [
        ("ok", None), ("ok", None), ("timeout", "a"), ("invalid", "b"), ("ok", None), ("invalid", "b"), ("ok", None)]
    assert {g.game for g in records.games} == {GAME}
    assert len(ledger_records(matches).games) == 8  # no player filter: x's game counts


def forfeit_ledger() -> list[MatchResult]:
    """b beats a in play (6-4), but a collects 10 wins from b's timeouts; c is weaker than both."""
    out = []
    for k in range(6):
        out.append(match(len(out), ["a", "b"], [-1, 1]))
    for k in range(4):
        out.append(match(len(out), ["a", "b"], [1, -1]))
    for k in range(10):
        out.append(match(len(out), ["a", "b"], [1, -1], statuses=["ok", "timeout"]))
    for k in range(6):
        out.append(match(len(out), ["a", "c"], [1, -1]))
        out.append(match(len(out), ["b", "c"], [1, -1]))
    out.append(match(len(out), ["c", "a"], [1, -1]))
    out.append(match(len(out), ["c", "b"], [1, -1], statuses=["ok", "invalid"]))
    return out


def test_views_put_forfeits_apart_from_skill():
    views = ranking_views(ledger_records(forfeit_ledger()), rounds=200)
    rows = {r["player"]: r for r in views.rows()}
    assert rows["a"]["place"] == 1 and rows["a"]["rank_without_forfeits"] == 2
    assert rows["b"]["rank_without_forfeits"] == 1
    assert rows["b"]["forfeit_rate"] == pytest.approx(11 / 27) and rows["b"]["timeout_rate"] == pytest.approx(10 / 27)
    assert rows["b"]["invalid_rate"] == pytest.approx(1 / 27) and rows["a"]["forfeit_rate"] == 0
    assert {w.player for w in views.warnings} == {"a", "b"}
    text = "\n".join(format_views(views))
    assert "warning: a: rank 1 counting forfeits, 2 without them" in text
    assert "without forfeited matches: b" in text


# ------------------------------------------------------------------------------------ several games


def two_game_ledger(tmp_path: Path) -> list[MatchResult]:
    """ann is best at tic-tac-toe, bob at connect four; connect four has 4x the games."""
    rng = np.random.default_rng(0)
    strength = {GAME: {"ann": 1.5, "bob": 0.0, "cy": -0.5}, "connect_four": {"ann": -0.5, "bob": 1.5, "cy": 0.0}}
    matches = []
    for game, count in ((GAME, 60), ("connect_four", 240)):
        for _ in range(count):
            a, b = rng.choice(["ann", "bob", "cy"], 2, replace=False)
            win = rng.random() < 1 / (1 + math.exp(strength[game][b] - strength[game][a]))
            matches.append(match(len(matches), [a, b], [1, -1] if win else [-1, 1], kind="rating", game=game))
    with Store.open(tmp_path / "ledger") as store:  # through the ledger: game ids survive the round trip
        store.record_matches(matches)
    with Store.open(tmp_path / "ledger", mode="read") as store:
        return [r.result for r in store.iter_matches()]


def test_several_games_give_per_game_boards_and_an_equal_weight_combined_board(tmp_path):
    matches = two_game_ledger(tmp_path)
    records = ledger_records(matches)
    views = ranking_views(records, rounds=200)
    assert views.multi_game and [b.game for b in views.per_game] == ["connect_four", GAME]
    games = list(records.games)
    np.testing.assert_allclose(views.ratings.rating, fit(games, by_game=True).rating)
    for board in views.per_game:
        np.testing.assert_allclose(board.ratings.rating, fit([g for g in games if g.game == board.game]).rating)
    per = {b.game: dict(zip(b.ratings.players, b.ratings.rating)) for b in views.per_game}
    assert max(per[GAME], key=per[GAME].get) == "ann" and max(per["connect_four"], key=per["connect_four"].get) == "bob"
    # equal weight per game: the pooled fit follows connect four's 240 games, the combined board does not
    pooled = dict(zip(fit(games).players, fit(games).rating))
    combined = dict(zip(views.ratings.players, views.ratings.rating))
    assert pooled["bob"] - pooled["ann"] > combined["bob"] - combined["ann"]
    text = "\n".join(format_views(views))
    assert "per game (each game's own fit; 'combined': every game the same total weight)" in text
    header = next(line for line in text.splitlines() if "connect_four" in line and "combined" in line)
    assert header.index("connect_four") < header.index(GAME) < header.index("combined")
    data = views.to_json()
    assert data["combined_equal_weight_per_game"] and {g["game"] for g in data["per_game"]} == {GAME, "connect_four"}
    assert set(data["players"][0]["per_game"]) == {GAME, "connect_four"}
    # the per-game interval is that game's own bootstrap
    assert views.per_game[1].intervals is not None and views.per_game[1].intervals.rounds == 200


# ------------------------------------------------------------------------------------ a real run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("views") / "run"
    subprocess.run([sys.executable, "-m", "ludus", "train", "quickstart", "--run", str(run), "--set",
                    "log.progress=false", "--set", "log.wandb=disabled", "--set", "log.tensorboard=false"],
                   check=True, capture_output=True, timeout=600)
    return run


def ludus(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "ludus", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ludus_ratings_prints_bradley_terry_beside_trueskill(run_dir):
    out = ludus("ratings", str(run_dir), "--rounds", "300")
    lines = out.splitlines()
    assert "ties count as half a win for each side" in lines[0] and "live learners excluded" in lines[0]
    assert "300 bootstrap rounds (seed 0)" in lines[0]
    for column in ("mu", "sigma", "mu-3s", "BT", "95% interval", "ranks", "nash", "games"):
        assert column in lines[1]
    assert "anchor:perfect" in out and "anchor:random" in out
    assert any(line.startswith("rank stability: ") and "greedy search" in line for line in lines)
    data = json.loads(ludus("ratings", str(run_dir), "--rounds", "300", "--json"))
    bt = data["bradley_terry"]
    assert bt["ties"] == "half a win" and bt["rounds"] == 300 and bt["stability"]["search"] == "greedy (an upper bound)"
    players = {r["player"] for r in bt["players"]}
    assert "main" not in players and players <= set(data["trueskill"]) | players
    row = bt["players"][0]
    assert row["low"] <= row["rating"] <= row["high"] and row["rank_low"] <= row["place"] <= row["rank_high"]
    assert json.loads(ludus("ratings", str(run_dir), "--rounds", "300", "--json")) == data  # deterministic
    assert "identical to the stored ratings" in ludus("ratings", str(run_dir), "--rebuild")


def test_the_ratings_views_rate_the_games_of_the_meta_game(run_dir):
    """`ludus ratings` reads the matches the meta-game's payoff matrix reads, between frozen members."""
    from ludus.evaluation.metagame import payoff_matrix_from_ledger
    from ludus.league.api import run_ranking

    ranking = run_ranking(run_dir, rounds=50)
    matrix = payoff_matrix_from_ledger(run_dir)
    assert ranking.views.board.games == int(matrix.games.sum() // 2)
    assert set(ranking.views.ratings.players) <= set(matrix.players)


def test_status_shows_the_score_against_each_anchor(run_dir):
    """A column per anchor: the payoff table's decayed score, what the run logs as eval/win_rate_vs_."""
    from ludus.league.status import format_status, status

    report = status(run_dir)
    assert report.anchors == ("anchor:random", "anchor:perfect")
    lines = format_status(report).splitlines()
    assert "vs random" in lines[1] and "vs perfect" in lines[1] and "return" in lines[1]
    main = next(m for m in report.members if m.player_id == "main")
    scores = {a: score for a, _, score in main.vs_anchors}
    logged = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert scores["anchor:random"] == pytest.approx(logged["eval/win_rate_vs_random"])
    assert scores["anchor:perfect"] == pytest.approx(logged["eval/win_rate_vs_perfect"])
    row = next(line for line in lines if line.startswith("main "))
    assert f"{scores['anchor:random']:.3f}" in row and f"{scores['anchor:perfect']:.3f}" in row
    assert report.to_json()["members"][0]["vs_anchors"].keys() == {"anchor:random", "anchor:perfect"}


def test_status_shows_the_output_policys_exploitability_where_logged(run_dir, tmp_path):
    from ludus.league.status import format_status, status

    assert status(run_dir).exploitability is None  # quickstart plays its newest snapshot: nothing measured
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["output_policy"] = "average"
    (copy / "config.json").write_text(json.dumps(config))
    with open(copy / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 6000, "eval/exploitability": 0.125}) + "\n")
        f.write(json.dumps({"step": 7000, "charts/episodic_return": 0.0}) + "\n")
    report = status(copy)
    assert report.exploitability == 0.125 and report.exploitability_step == 6000
    assert "output-policy exploitability 0.125 (at 6,000 env steps)" in format_status(report).splitlines()[0]


def test_the_report_shows_both_ratings_and_the_stability_figure(run_dir, tmp_path):
    from ludus.evaluation.report import build_report, render_html

    report = build_report(run_dir)
    assert report.ranking is not None
    page = render_html(report)
    assert 'id="stability"' in page and "rank stability: the order of the top" in page
    assert "<th>BT 95% interval</th>" in page and "<th>mu-3&sigma;</th>" in page and 'id="fig-bt"' in page


def test_evaluate_places_the_candidate_by_bradley_terry(run_dir):
    from ludus.evaluation.evaluate import evaluate_checkpoint, format_evaluation

    snapshot = sorted((run_dir / "snapshots").iterdir())[-1]
    report = evaluate_checkpoint(snapshot, run_dir, games_per_opponent=4)
    assert report.bt_rating is not None and report.bt_low <= report.bt_rating <= report.bt_high
    assert report.bt_rank_low <= report.bt_rank <= report.bt_rank_high <= report.bt_players
    text = format_evaluation(report)
    assert "TrueSkill placement" in text and "Bradley-Terry placement" in text
    assert report.to_json()["bt_games"] == report.bt_games


# ------------------------------------------------------------------------------------ the arena


def synthetic_arena(directory: Path, matches: int = 120, seed: int = 0):
    """An arena of three built-in bots and synthetic matches (no sandbox needed), a few forfeited."""
    from ludus.arena.api import Arena

    arena = Arena.open(directory, GAME)
    names = [arena.submit(bot, name=name).player_id for bot, name in
             (("bot:perfect", "perfect"), ("bot:mcts-10", "mcts"), ("bot:random", "random"))]
    rng = np.random.default_rng(seed)
    strength = {"perfect": 1.0, "mcts": 0.3, "random": -1.0}
    with Store.open(directory) as store:
        first = store.max_match_id() + 1
        batch = []
        for k in range(matches):
            a, b = rng.choice(names, 2, replace=False)
            win = rng.random() < 1 / (1 + math.exp(strength[b] - strength[a]))
            statuses = ["ok", "ok"]
            if k % 15 == 7:
                statuses = ["ok", "timeout"]
                win = True
            batch.append(match(first + k, [a, b], [1, -1] if win else [-1, 1], statuses=statuses))
        store.record_matches(batch)
    return arena


def test_arena_leaderboard_text_and_json_carry_bradley_terry_and_forfeit_rates(tmp_path):
    from ludus.arena.leaderboard import format_leaderboard
    from ludus.arena.service import leaderboard_json

    arena = synthetic_arena(tmp_path / "arena")
    board = arena.leaderboard()
    text = format_leaderboard(board)
    header = text.splitlines()[1]
    for column in ("mu-3s", "95% interval", "BT", "BT 95%", "ranks", "forfeit", "forfeits"):
        assert column in header
    assert "BT: Bradley-Terry over 120 games (pairs of seats), ties count as half a win" in text
    assert any(line.startswith("rank stability: ") for line in text.splitlines())
    data = leaderboard_json(board)
    rows = {r["player_id"]: r for r in data["rows"]}
    timeouts = sum(r["faults"].get("timeout", 0) for r in data["rows"])
    assert timeouts == 8
    for r in data["rows"]:
        bt = r["bt"]
        assert bt["low"] <= bt["rating"] <= bt["high"] and bt["games"] == r["games"]
        assert bt["timeout_rate"] == pytest.approx(r["faults"].get("timeout", 0) / r["games"])
        assert bt["rating_without_forfeits"] is not None
    assert rows["perfect"]["bt"]["place"] == 1
    info = data["bradley_terry"]
    assert info["rounds"] == 1000 and info["stability_text"].startswith("rank stability: ")
    assert info["games"] == info["slow_views_games"] == 120
    json.dumps(data)  # the service serves it as is


def test_the_service_caches_the_slow_views_and_its_pages_stay_within_the_policy(tmp_path):
    import re

    from fastapi.testclient import TestClient

    from ludus.arena.leaderboard import RankingCache, build_leaderboard
    from ludus.arena.service import ArenaService, SecurityHeaders, ServiceConfig, make_app, security_headers

    arena = synthetic_arena(tmp_path / "arena", matches=60)
    cache = RankingCache(min_interval_s=3600)
    with Store.open(arena.directory, mode="read") as store:
        first = build_leaderboard(store, cache=cache)
        assert build_leaderboard(store, cache=cache).ranking is first.ranking  # same ledger: nothing refitted
    with Store.open(arena.directory) as store:
        store.record_matches([match(10_000 + k, ["perfect", "random"], [1, -1]) for k in range(5)])
    with Store.open(arena.directory, mode="read") as store:
        grown = build_leaderboard(store, cache=cache).ranking
    assert grown.board.games == 65 and grown.slow_games == 60 and grown.stale
    assert grown.intervals is first.ranking.intervals and grown.stability is first.ranking.stability
    assert not np.allclose(grown.ratings.rating, first.ranking.ratings.rating)  # the point fit is fresh
    cache.min_interval_s = 0.0
    with Store.open(arena.directory, mode="read") as store:
        assert not build_leaderboard(store, cache=cache).ranking.stale  # past the interval: all recomputed
    # ... and the service: JSON, the live page and an entrant's page
    service = ArenaService(arena, ServiceConfig(schedule=False))
    client = TestClient(SecurityHeaders(make_app(service), security_headers()))
    data = client.get("/api/leaderboard").json()
    assert data["rows"][0]["bt"]["rank_low"] >= 1 and data["bradley_terry"]["stability_text"]
    page = client.get("/")
    assert page.status_code == 200 and 'id="stability"' in page.text and "<th>BT 95% interval</th>" in page.text
    assert 'class="forfeit-rate"' in page.text and 'id="forfeits"' in page.text
    entrant = client.get("/entrants/random").text
    assert 'id="bt"' in entrant and "Bradley-Terry <b>" in entrant and "timeout" in entrant
    for html in (page.text, entrant):  # the policy refuses inline styles and unhashed scripts
        assert not re.search(r"\sstyle=", html)
        assert len(re.findall(r"<style>", html)) == 1


def test_arena_leaderboard_cli_and_page_show_bradley_terry(tmp_path):
    from ludus.arena.leaderboard import render_html

    arena = synthetic_arena(tmp_path / "arena", matches=45)
    out = ludus("arena", "leaderboard", "--arena", str(arena.directory))
    assert "BT 95%" in out and "rank stability" in out
    page = render_html(arena.leaderboard(recent=0), "replays")
    assert "<th>BT 95% interval</th>" in page and 'id="stability"' in page and 'id="forfeits"' in page


def test_records_type_is_frozen():
    records = LedgerRecords((Game("a", "b", 1.0),), (), 0)
    with pytest.raises(AttributeError):
        records.skipped = 1  # type: ignore[misc]
    assert bootstrap_intervals(list(records.games) * 3, 10).rounds == 10
