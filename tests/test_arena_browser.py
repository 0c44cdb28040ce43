"""The arena's leaderboard page in a real browser: headless Chromium loads the static file, its DOM
holds the expected rows and charts, and its screenshot is not blank.

Chromium is required (Debian: `apt-get update && apt-get install -y chromium`); a machine without
it fails this test with that message instead of skipping it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ludus.arena.api import Arena, ArenaConfig
from ludus.arena.sandbox.isolation import Isolation, SandboxConfig, resolve_isolation
from ludus.arena.match import MatchLimits
from ludus.arena.sandbox.limits import SandboxLimits

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "agents"
ZOO = REPO / "tests" / "hostile_agents"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to render the leaderboard page: install it with "
                "`apt-get update && apt-get install -y chromium`")


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          timeout=180, check=True, env={**os.environ, "HOME": str(profile)})


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A played arena (two honest agents, a bot, one agent that always forfeits) and its page."""
    if resolve_isolation(SandboxConfig()) == Isolation.NONE:
        message = "agents run in the sandbox, which needs root or user namespaces"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("browser")
    config = ArenaConfig(match_limits=MatchLimits(time_per_move_s=1.0, overage_s=1.0),
                         sandbox_limits=SandboxLimits(startup_timeout_s=30))
    arena = Arena.open(root / "arena", "tic_tac_toe", config)
    for path in (EXAMPLES / "random_python", EXAMPLES / "random_sh", "bot:perfect", ZOO / "illegal_move"):
        arena.submit(path)
    arena.run_tournament(games_per_pair=2, seed=3)
    files = arena.write_page(root / "site" / "index.html")
    return arena, Path(files.html)


def test_page_is_self_contained(page):
    arena, html_path = page
    text = html_path.read_text()
    assert not re.search(r"\bsrc\s*=", text, re.I)
    links = re.findall(r"\bhref\s*=\s*\"([^\"]*)\"", text, re.I)
    # url(#id): an inline svg's own clip paths; nothing is fetched
    assert links and not re.search(r"\burl\s*\((?!#)|@import", text)
    for link in links:  # in-page anchors, or replay pages beside the page
        assert link.startswith("#") or re.fullmatch(r"index_replays/match-\d+\.html", link), link
        if not link.startswith("#"):
            player = (html_path.parent / link).read_text()
            assert 'class="ludus-replay"' in player and not re.search(r"\bsrc\s*=", player, re.I)
            transcript = (html_path.parent / link).with_suffix(".txt").read_text()
            assert transcript.startswith(f"match {link.split('-')[-1][:-5]} (arena, tournament 1")


def test_page_renders_in_headless_chromium(page, tmp_path):
    from PIL import Image

    arena, html_path = page
    binary = chromium()
    url = html_path.resolve().as_uri()
    dom = run_chromium(binary, tmp_path / "profile-dom", "--dump-dom", url).stdout.decode()
    board = arena.leaderboard()
    rows = re.findall(r'<tr class="entrant" id="player-(\d+)" data-player="([^"]+)">', dom)
    assert [(int(rank), name) for rank, name in rows] == [(r.rank, r.player_id) for r in board.rows]
    assert {name for _, name in rows} == {"random-python", "random-sh", "perfect", "illegal_move"}
    assert len(re.findall(r'<tr class="match', dom)) == board.total_matches == 12
    assert len(re.findall(r'<tr class="match forfeit"', dom)) == 6  # every match of illegal_move
    for figure in ("fig-ratings", "fig-skill", "fig-head-to-head"):
        assert re.search(rf'<figure id="{figure}"><svg[^>]*class="ludus-chart', dom), figure
    assert "illegal action" in dom

    shot = tmp_path / "page.png"
    run_chromium(binary, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,1800",
                 "--hide-scrollbars", url)
    with Image.open(shot) as image:
        pixels = image.convert("RGB")
        assert pixels.size == (1200, 1800)
        colors = pixels.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # text, charts and table rules, not a blank page
    total = sum(n for n, _ in colors)
    white = sum(n for n, c in colors if min(c) >= 245)
    assert 0.02 < 1 - white / total < 0.9
    # the charts' blue (Okabe-Ito #0072B2: ratings line, skill bars) is on screen
    assert sum(n for n, (r, g, b) in colors if abs(r - 0x00) < 30 and abs(g - 0x72) < 30 and abs(b - 0xB2) < 30) > 500
