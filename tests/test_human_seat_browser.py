"""A person plays an entrant on `ludus arena serve`'s play page in a real browser (headless Chromium
over the DevTools protocol), by clicking the board's cells, while the scheduler plays its rating
matches; the finished game links to its replay, and the person is on the leaderboard beside the
agents. Chromium is required (`.ci/run` installs it); without it this test fails with that message.
"""

from __future__ import annotations

import json
import time

from ludus.arena.testing import ServiceProcess, run_ludus
from tests.test_arena_service import EXAMPLES, GAME, require_isolation
from tests.test_arena_service_browser import SCREENSHOTS, Browser


def test_a_person_plays_an_entrant_by_clicking_and_is_on_the_leaderboard(tmp_path):
    require_isolation()
    arena_dir = tmp_path / "arena"
    token = run_ludus("arena", "token", "add", "dana", "--game", GAME, "--arena", str(arena_dir)).stdout.split()[-1]
    run_ludus("arena", "submit", "bot:random", "--arena", str(arena_dir))
    run_ludus("arena", "submit", str(EXAMPLES / "random_python"), "--name", "randy", "--arena", str(arena_dir))
    server = ServiceProcess(arena_dir, "--placement-games", "2").start()
    browser = Browser()
    base = f"http://127.0.0.1:{server.port}"
    try:
        browser.goto(f"{base}/play")
        assert browser.evaluate("[...document.querySelectorAll('#start [name=opponent] option')]"
                                ".map(o => o.value).join(',')") == "random,randy"
        browser.evaluate(f"document.querySelector('#start [name=token]').value = {json.dumps(token)}")
        browser.evaluate("document.querySelector('#start [name=opponent]').value = 'randy'")  # sandboxed
        browser.evaluate("document.querySelector('#start [name=seat]').value = '0'")
        browser.evaluate("document.querySelector('#start button').click()")
        browser.wait_for("document.body.dataset.status === 'your-turn'", timeout=60)
        assert browser.evaluate("document.querySelectorAll('#board button.cell').length") == 9
        assert browser.evaluate("document.querySelectorAll('#board button.cell:enabled').length") == 9
        clicks = 0
        end = time.monotonic() + 120
        while browser.evaluate("document.body.dataset.status") != "over":
            assert time.monotonic() < end, browser.evaluate("document.getElementById('status').textContent")
            status = browser.wait_for("['your-turn', 'over', 'failed'].includes(document.body.dataset.status) && "
                                      "document.body.dataset.status", timeout=60)
            assert status != "failed", browser.evaluate("document.getElementById('status').textContent")
            if status == "your-turn":
                marks = browser.evaluate("[...document.querySelectorAll('#board button.cell')]"
                                         ".map(b => b.textContent || '.').join('')")
                assert marks.count("x") == clicks  # every click of ours is on the board, and only those
                if clicks == 1:
                    browser.screenshot(SCREENSHOTS / "play-in-progress.png")
                    browser.goto(f"{base}/play")  # a reload comes back to the game in progress
                    browser.wait_for("document.body.dataset.status === 'your-turn'", timeout=30)
                    assert browser.evaluate("[...document.querySelectorAll('#board button.cell')]"
                                            ".map(b => b.textContent || '.').join('')") == marks
                # the disabled cells are the taken ones: click the first free cell
                browser.evaluate("document.querySelector('#board button.cell:enabled').click()")
                clicks += 1
                browser.wait_for("document.body.dataset.status !== 'your-turn' || "
                                 f"[...document.querySelectorAll('#board button.cell')].filter(b => "
                                 f"b.textContent === 'x').length === {clicks}", timeout=30)
        assert clicks >= 3
        result = browser.evaluate("document.getElementById('result').textContent")
        assert any(word in result for word in ("you won", "you lost", "a draw")), result
        match_id = int(browser.evaluate("document.getElementById('result').dataset.matchId"))
        browser.screenshot(SCREENSHOTS / "play-over.png")
        match = server.get(f"/api/matches/{match_id}")[1]
        assert match["players"] == ["human:dana", "randy"] and match["moves"] >= 5

        browser.evaluate("document.getElementById('replay-link').click()")
        browser.wait_for(f"location.pathname === '/matches/{match_id}' && !!document.querySelector('.ludus-replay')")
        # the replay draws the board as a board: 9 cells, and at the last step the recorded marks
        browser.evaluate("document.querySelector('.ludus-replay .last').click()")
        board = browser.evaluate("document.querySelector('.ludus-replay .board').textContent")
        assert browser.evaluate("document.querySelectorAll('.board-drawing svg rect').length") == 9
        drawn = browser.evaluate("[...document.querySelectorAll('.board-drawing [data-mark]')]"
                                 ".map(m => m.dataset.mark).join('')")
        assert drawn == "".join(c for c in board if c not in ".\n") and drawn.count("x") == clicks
        browser.screenshot(SCREENSHOTS / "play-replay.png")
        browser.goto(f"{base}/")
        row = "document.querySelector('tr.entrant[data-player=\"human:dana\"]')"
        assert browser.wait_for(f"{row} && {row}.querySelector('td.games').textContent", timeout=30) == "1"
        assert browser.evaluate(f"{row}.querySelectorAll('td')[2].textContent") == "human"
        # the agents' own rating matches went on meanwhile, on the same board
        browser.wait_for("document.querySelector('tr.entrant[data-player=\"random\"] td.games') && Number("
                         "document.querySelector('tr.entrant[data-player=\"random\"] td.games').textContent) >= 2",
                         timeout=120)
        browser.screenshot(SCREENSHOTS / "play-leaderboard.png")
        browser.evaluate(f"{row}.querySelector('a').click()")  # the person's own page
        browser.wait_for("location.pathname === '/entrants/human%3Adana'")
        assert "a person, account dana" in browser.wait_for("document.getElementById('owner').textContent")
        assert browser.evaluate("document.querySelectorAll('#entrant-matches tr').length") == 2  # header + 1
        browser.screenshot(SCREENSHOTS / "play-person.png")
    finally:
        browser.close()
        server.stop()
