"""The league report page and the chart module, checked in headless Chromium.

Chromium is a test dependency (`bash scripts/setup.sh --test` installs Debian's `chromium`); these
tests fail, not skip, when it is missing.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ludus import charts
from ludus.evaluation.report import build_report, report_charts, write_report
from ludus.league.api import League, load_config
from ludus.cli import main

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
EXPLOITABILITY_POINTS = [(1000, 0.45), (2000, 0.31), (3000, 0.22)]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: run `apt-get update && apt-get install -y chromium` "
                    "(or `bash scripts/setup.sh --test`)")
    return path


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    result = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"chromium failed ({result.returncode}): {result.stderr[-2000:]}"
    return result


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "run"
    # the small tic-tac-toe league (the old quickstart): snapshots within two iterations
    small = str(Path(__file__).parent / "fixtures" / "small_tic_tac_toe.yaml")
    league = League.create(load_config(small, ["iterations=2", "log.progress=false"]), path)
    try:
        league.run()
    finally:
        league.close()
    # Tic-tac-toe logs no exploitability; add what a Kuhn run would log, and a half-written
    # last line as a running league may leave it.
    with open(path / "metrics.jsonl", "a") as f:
        for step, value in EXPLOITABILITY_POINTS:
            f.write(json.dumps({"step": step, "eval/exploitability": value}) + "\n")
        f.write('{"step": 4000, "eval/exploi')
    return path


@pytest.fixture(scope="module")
def written(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("page")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.rglob("*") if p.is_file()}
    files = write_report(run_dir, out / "report.html")
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.rglob("*") if p.is_file()}
    assert before == after, "building the report changed the run directory"
    return files


def test_page_is_self_contained(written):
    page = Path(written.html).read_text()
    # references inside the page (an svg's markers and clip paths: "#id") only, nothing fetched
    assert not re.search(r"\b(src|href)\s*=\s*[\"'](?!#)", page, re.IGNORECASE)
    assert "<script" not in page.lower() and not re.search(r"url\((?!#)", page) and "@import" not in page
    assert page.count("<svg") >= 7  # ratings, payoff, nash, alpharank, genealogy, exploitability, matchmaking


def test_learning_curves_read_metrics_jsonl_in_one_pass(run_dir):
    from ludus.evaluation.report import read_curves

    curves = read_curves(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().split("\n")[:-1]]  # not the half line
    iterations = [r for r in rows if "charts/iteration_seconds" in r]
    assert [p[0] for p in curves["charts/steps_per_second"]] == [float(r["step"]) for r in iterations]
    walls = [p[1] for p in curves["charts/steps_per_second"]]
    assert walls == sorted(walls) and walls[-1] == pytest.approx(sum(r["charts/iteration_seconds"] for r in iterations))
    assert {"eval/win_rate_vs_random", "eval/win_rate_vs_perfect", "losses/main/entropy"} <= set(curves)
    assert all(0.0 <= v <= 1.0 for _, _, v in curves["eval/win_rate_vs_random"])


def test_every_member_is_drawn_and_heatmap_cells_carry_their_game_counts(run_dir):
    from ludus.evaluation.report import MAX_RATING_LINES, build_report, payoff_chart, ratings_chart

    report = build_report(run_dir)
    svg = ratings_chart(report).svg()
    assert svg.count("-series-") == len(report.tracks) and "not shown" not in svg
    assert len(report.tracks) <= MAX_RATING_LINES or "thin grey" in svg
    games = report.payoff.subset([p for p in report.payoff.players]).games
    heat = payoff_chart(report).svg()
    assert f"({int(games.max())})" in heat  # the largest count, written in its cell


def test_report_data(run_dir):
    report = build_report(run_dir)
    assert report.exploitability == tuple((float(s), v) for s, v in EXPLOITABILITY_POINTS)
    assert report.matchmaking.learners == ("main",)
    assert report.matchmaking.counts.sum() == sum(
        n for k, n in report.matches_by_kind.items() if k == "training")  # two-player: one opponent per game
    assert report.metagame is not None and abs(sum(report.metagame.nash) - 1) < 1e-9
    assert {t.player_id for t in report.tracks} == set(report.ratings)


def test_chromium_renders_the_expected_elements(written, tmp_path):
    dom = _run_chromium(tmp_path, "--dump-dom", Path(written.html).as_uri()).stdout
    for element_id in ("summary", "fig-ratings", "leaderboard", "fig-payoff", "fig-nash", "fig-alpharank",
                       "fig-genealogy", "fig-exploitability", "fig-matchmaking", "png-note", "learning",
                       "fig-main-rating", "fig-main-rating-wall", "fig-win-rates", "fig-losses", "fig-entropy",
                       "fig-kl", "fig-throughput"):
        assert f'id="{element_id}"' in dom, element_id
    assert dom.count("<svg") >= 7
    for player in ("anchor:perfect", "main@0", "main@1"):
        assert player in dom


def test_screenshot_is_not_blank(written, tmp_path):
    shot = tmp_path / "shot.png"
    _run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1800", "--hide-scrollbars",
                  Path(written.html).as_uri())
    image = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert image.shape[0] >= 1000 and image.shape[1] >= 1000
    assert image.std() > 20.0, "the screenshot is (nearly) one colour"
    colours = {tuple(c) for c in image.reshape(-1, 3)[::7].astype(int)}
    assert len(colours) > 50
    # the palette's first colour (ratings lines, bars) is on screen
    assert np.any(np.all(np.abs(image - np.array([0x00, 0x72, 0xB2])) < 12, axis=-1))


def test_png_plots_beside_the_page(written):
    names = {Path(p).name for p in written.pngs}
    assert names == {"ratings.png", "payoff.png", "nash.png", "alpharank.png", "genealogy.png",
                     "exploitability.png", "matchmaking.png", "main-rating.png", "main-rating-wall.png",
                     "win-rates.png", "losses.png", "entropy.png", "kl.png", "throughput.png", "return.png",
                     "bradley_terry.png"}
    for path in written.pngs:
        assert Path(path).parent == Path(written.html).parent / "report_png"
        image = np.asarray(Image.open(path).convert("L"), dtype=np.float64)
        assert image.shape[0] > 100 and image.shape[1] > 200
        assert image.std() > 10.0, f"{path} is blank"


def test_cli_report(run_dir, tmp_path, capsys):
    assert main(["report", str(run_dir), "--html", str(tmp_path / "r.html"), "--no-png"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "r.html").is_file() and not (tmp_path / "r_png").exists()
    assert main(["report", str(tmp_path / "nothing"), "--html", str(tmp_path / "x.html")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# The chart module on its own


def test_every_chart_is_well_formed_svg(run_dir):
    for name, chart in report_charts(build_report(run_dir)).items():
        root = ET.fromstring(chart.svg())
        assert root.tag.endswith("svg"), name
        assert root.get("viewBox") == f"0 0 {chart.width} {chart.height}"


def test_line_chart_draws_bands_and_rejects_ragged_series():
    chart = charts.line_chart([charts.Series("a", (0, 1, 2), (1, 2, 3), lower=(0, 1, 2), upper=(2, 3, 4)),
                               charts.Series("b", (0, 1, 2), (3, 2, 1))])
    svg = chart.svg()
    assert svg.count("-band-") == 1 and svg.count("-series-") == 2  # one band, two lines (with hover texts)
    assert "<title>a: 95% interval</title>" in svg
    with pytest.raises(ValueError):
        charts.Series("bad", (0, 1), (1,))
    with pytest.raises(ValueError):
        charts.Series("bad", (0, 1), (1, 2), lower=(0,))


def test_heatmap_marks_missing_cells_and_escapes_labels():
    chart = charts.heatmap(["<a>", "b"], ["<a>", "b"], [[None, 0.25], [0.75, None]])
    svg = chart.svg()
    assert "&lt;a&gt;" in svg and "<a>" not in svg
    ET.fromstring(svg)
    assert "no data" in svg
    with pytest.raises(ValueError):
        charts.heatmap(["a"], ["a", "b"], [[0.5]])


def test_lineage_lanes_follow_branches():
    chain = [charts.TreeNode(f"m@{i}", f"m@{i - 1}" if i else None, time=i) for i in range(5)]
    assert charts._lanes(chain) == {f"m@{i}": 0 for i in range(5)}
    branched = chain + [charts.TreeNode("x@0", "m@2", time=3), charts.TreeNode("anchor", None, time=0)]
    lanes = charts._lanes(branched)
    assert lanes["x@0"] not in (lanes["m@3"], lanes["anchor"]) and lanes["m@3"] == 0
    chart = charts.lineage_tree(branched, title="t")
    assert len(chart.tooltips) == len(branched)  # one dot with a hover text per node
    # parent edges: one per node with a parent among the nodes
    (ax,) = chart.figure.axes[:1]
    assert sum(line.get_color() == "#AAAAAA" for line in ax.get_lines()) == 5


def test_bar_chart_whiskers_and_png(tmp_path):
    chart = charts.bar_chart(["a", "b"], [0.4, 0.7], intervals=[(0.3, 0.5), (0.6, 0.8)], reference=0.5)
    assert "<title>a: 0.400 [0.3, 0.5]</title>" in chart.svg()
    chart.png(str(tmp_path / "bars.png"), scale=1.0)
    image = Image.open(tmp_path / "bars.png")
    assert image.size == (chart.width, chart.height)


def test_a_member_has_one_colour_in_every_chart_of_the_page(run_dir):
    """The ratings lines, the Bradley-Terry bars and the meta-game bars draw each member in its page
    colour (`charts.player_colors`): the colour found next to a member's name is the same in each."""
    from ludus.evaluation.report import bt_chart, metagame_charts, player_colors, ratings_chart

    assert charts.player_colors(["a", "b", "a", "c"]) == {"a": charts.PALETTE[0], "b": charts.PALETTE[1],
                                                          "c": charts.PALETTE[2]}
    report = build_report(run_dir)
    colors = player_colors(report)
    used = {c.lower() for c in colors.values()}
    svgs = [ratings_chart(report).svg(), bt_chart(report).svg()]
    if report.metagame is not None:
        svgs += [c.svg() for c in metagame_charts(report.metagame, colors)]
    for svg in svgs:
        fills = {m.lower() for m in re.findall(r"(?:fill|stroke):\s*(#[0-9a-fA-F]{6})", svg)}
        assert fills & used, "no member colour in a chart"
    bars = bt_chart(report)
    rows = report.ranking.rows()
    bar_fill = r'-bar-\d+"><title>[^<]*</title>\s*<path[^>]*?fill:\s*(#[0-9a-fA-F]{6})'
    drawn = [m.lower() for m in re.findall(bar_fill, bars.svg())]
    assert drawn[:len(rows)] == [colors[r["player"]].lower() for r in rows]
