"""A person's path through the arena service, in a real browser (headless Chromium driven over the
DevTools protocol): upload an agent through the HTML form with a token the operator made, see it
validated, see it placed on the live leaderboard after the scheduler's matches, open one of its
matches and step the replay player forward and back — the board in the DOM equals the recorded
position at every step.

Chromium is required (Debian: `apt-get install chromium`; `.ci/run` installs it); a machine without
it fails this test with that message instead of skipping it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from ludus.arena.testing import ServiceProcess, free_port, run_ludus
from tests.test_arena_service import EXAMPLES, GAME, require_isolation

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(os.environ.get("LUDUS_SCREENSHOTS", tempfile.gettempdir())) / "ludus-screenshots"


class Browser:
    """Headless Chromium and one page, over the DevTools protocol (websocket, JSON commands)."""

    def __init__(self):
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            pytest.fail("chromium is not installed: `apt-get install chromium` (scripts/setup.sh --test does it)")
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="ludus-chromium-")
        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--remote-debugging-port={self.port}", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "--window-size=1200,1400", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("chromium's DevTools endpoint did not come up in 30 s")
            time.sleep(0.2)
        from websockets.sync.client import connect

        self.socket = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.next_id = 0
        self.command("Page.enable")

    def command(self, method: str, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.command("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href === " + json.dumps(url))

    def wait_for(self, expression: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}")

    def set_file(self, selector: str, path: Path) -> None:
        root = self.command("DOM.getDocument")["root"]["nodeId"]
        node = self.command("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.command("DOM.setFileInputFiles", files=[str(path)], nodeId=node)

    def screenshot(self, path: Path) -> None:
        data = self.command("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def test_a_person_submits_through_the_page_and_watches_a_replay(tmp_path):
    require_isolation()
    arena_dir = tmp_path / "arena"
    token = run_ludus("arena", "token", "add", "dana", "--game", GAME, "--arena", str(arena_dir)).stdout.split()[-1]
    run_ludus("arena", "submit", "bot:random", "--arena", str(arena_dir))
    run_ludus("arena", "submit", "bot:mcts-10", "--arena", str(arena_dir))
    archive = tmp_path / "my_agent.zip"
    shutil.make_archive(str(archive.with_suffix("")), "zip", EXAMPLES, "random_python")
    server = ServiceProcess(arena_dir, "--placement-games", "4").start()
    browser = Browser()
    base = f"http://127.0.0.1:{server.port}"
    try:
        browser.goto(f"{base}/submit")
        browser.evaluate(f"document.querySelector('#upload [name=token]').value = {json.dumps(token)}")
        browser.evaluate("document.querySelector('#upload [name=name]').value = 'dana-bot'")
        browser.set_file("#upload [name=archive]", archive)
        browser.evaluate("document.querySelector('#upload button').click()")
        status = browser.wait_for("document.getElementById('result').dataset.status", timeout=120)
        assert status == "201", browser.evaluate("document.getElementById('result').textContent")
        assert browser.evaluate("document.getElementById('entrant-link').textContent") == "dana-bot@1"
        browser.screenshot(SCREENSHOTS / "arena-submit.png")

        # The live leaderboard: the page reloads itself as matches are recorded.
        browser.goto(f"{base}/")
        games = browser.wait_for(
            "(function () { var row = document.querySelector('tr.entrant[data-player=\"dana-bot@1\"]');"
            " var n = row ? Number(row.querySelector('td.games').textContent) : 0; return n >= 4 ? n : 0; })()",
            timeout=180)
        assert games >= 4
        browser.screenshot(SCREENSHOTS / "arena-leaderboard.png")

        match_id = server.get("/api/entrants/dana-bot@1")[1]["matches"][0]["id"]
        episode = server.get(f"/api/matches/{match_id}/episode")[1]
        browser.goto(f"{base}/matches/{match_id}")
        board = "document.querySelector('.ludus-replay .board').textContent"
        step = "Number(document.querySelector('.ludus-replay').dataset.step)"
        assert browser.evaluate(board) == episode["steps"][0]["board"] and browser.evaluate(step) == 0
        last = len(episode["steps"]) - 1
        assert last >= 5  # tic-tac-toe takes at least five moves
        for k in range(1, last + 1):  # forward, one step at a time
            browser.evaluate("document.querySelector('.ludus-replay .forward').click()")
            assert browser.evaluate(step) == k and browser.evaluate(board) == episode["steps"][k]["board"]
        browser.evaluate("document.querySelector('.ludus-replay .forward').click()")  # stays at the end
        assert browser.evaluate(step) == last
        for k in range(last - 1, last - 4, -1):  # and back
            browser.evaluate("document.querySelector('.ludus-replay .back').click()")
            assert browser.evaluate(step) == k and browser.evaluate(board) == episode["steps"][k]["board"]
        browser.evaluate("var s = document.querySelector('.ludus-replay .scrub'); s.value = '2';"
                         " s.dispatchEvent(new Event('input'))")
        assert browser.evaluate(step) == 2 and browser.evaluate(board) == episode["steps"][2]["board"]
        browser.evaluate("document.querySelector('.ludus-replay .play').click()")  # plays to the end by itself
        browser.wait_for(f"{step} === {last}", timeout=30)
        assert browser.evaluate(board) == episode["steps"][last]["board"]
        browser.screenshot(SCREENSHOTS / "arena-replay.png")
    finally:
        browser.close()
        server.stop()
