"""The arena service against hostile clients (issue 74, item 6): match ids no ledger can hold,
security headers and a Content-Security-Policy that still lets the pages run, a rate limit on
failed authentication, read deadlines against half-open connections, upload refusals without the
server's paths, and the uploads a killed service left behind.

The service runs in this process on a loopback port, built by `ludus.arena.service.build_server` as
`ludus arena serve` builds it, with the short timeouts and limits each test needs. Its arena has
two built-in bots (they play in-process, no sandbox needed) and two recorded matches."""

from __future__ import annotations

import html.parser
import http.client
import io
import json
import os
import select
import socket
import threading
import time
import zipfile
from pathlib import Path

import pytest

from ludus.arena.accounts import add_account
from ludus.arena.api import Arena
from ludus.arena.service import ArenaService, ServiceConfig, build_server, leaderboard_page, scrub_paths, security_headers
from ludus.arena.testing import free_port
from ludus.league.records.ledger import Store
from ludus import cli

GAME = "tic_tac_toe"
HUGE = str(1 << 63)


class Served:
    """An arena service on a free loopback port, in a thread of this process."""

    def __init__(self, arena_dir: Path, **config):
        self.arena = Arena.open(arena_dir, GAME)
        self.config = ServiceConfig(port=free_port(), schedule=False, **config)
        self.service = ArenaService(self.arena, self.config)
        self.server = build_server(self.service)
        self.port = self.config.port
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process service did not start within 30 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = None,
                source: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body) of one request from address `source`."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(source, 0))
        try:
            connection.request(method, path, body=body,
                               headers={"Authorization": f"Bearer {token}"} if token is not None else {})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def arena_dir(tmp_path_factory) -> Path:
    """An arena with two bots, two recorded matches and an account (its token in `.token`)."""
    directory = tmp_path_factory.mktemp("hardening") / "arena"
    arena = Arena.open(directory, GAME)
    arena.submit("bot:random")
    arena.submit("bot:mcts-10")
    assert len(arena.run_tournament(games_per_pair=2, workers=1).matches) == 2
    with Store.open(directory, mode="write") as store:
        (directory.parent / "token").write_text(add_account(store, "alice"))
    return directory


@pytest.fixture(scope="module")
def served(arena_dir):
    with Served(arena_dir) as served:
        yield served


def token(arena_dir: Path) -> str:
    return (arena_dir.parent / "token").read_text()


# ------------------------------------------------------------------------------------- match ids


@pytest.mark.parametrize("match_id", [HUGE, "99999999999999999999", str((1 << 63) - 1), "-1", "1e3", "seven"])
@pytest.mark.parametrize("route", ["/api/matches/{}", "/api/matches/{}/episode", "/matches/{}"])
def test_a_match_id_no_ledger_holds_is_404_with_a_one_line_json_error(served, arena_dir, route, match_id):
    status, headers, body = served.request("GET", route.format(match_id))
    assert status == 404 and headers["content-type"] == "application/json", (status, body)
    answer = json.loads(body)
    assert list(answer) == ["error"] and "no match" in answer["error"], answer
    assert b"\n" not in body and str(arena_dir) not in answer["error"] and "Traceback" not in answer["error"]


def test_a_recorded_match_is_still_served(served):
    status, _, body = served.request("GET", "/api/matches/1")
    assert status == 200 and json.loads(body)["id"] == 1
    status, _, body = served.request("GET", "/matches/0")
    assert status == 200 and b'class="ludus-replay"' in body


@pytest.mark.parametrize("argv", [["replay", "{run}", "99999999999999999999"], ["replay", "{run}", HUGE],
                                  ["arena", "replay", "--arena", "{arena}", "99999999999999999999"],
                                  ["arena", "replay", "--arena", "{arena}", "-1"]])
def test_the_cli_refuses_a_match_id_no_ledger_holds_in_one_line_with_exit_2(arena_dir, tmp_path, capsys, argv):
    code = cli.main([a.format(run=tmp_path, arena=arena_dir) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ludus: error: match {argv[-1]} cannot exist: match ids are whole numbers"), err


# --------------------------------------------------------------------------------------- headers


def test_every_page_and_api_answer_carries_the_security_headers(served, arena_dir):
    for method, path, who in (("GET", "/", None), ("GET", "/submit", None), ("GET", "/entrants/random", None),
                              ("GET", "/matches/0", None), ("GET", "/api/leaderboard", None),
                              ("GET", "/api/entrants/random", None), ("GET", "/api/matches/0/episode", None),
                              ("GET", f"/api/matches/{HUGE}", None), ("GET", "/no/such/page", None),
                              ("POST", "/api/submissions?name=x", None),
                              ("POST", "/api/submissions?name=x", token(arena_dir))):
        status, headers, _ = served.request(method, path, body=b"" if method == "POST" else None, token=who)
        assert status in (200, 400, 401, 404), (path, status)
        policy = headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, (path, headers)
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert headers.get("x-content-type-options") == "nosniff", (path, headers)
        assert headers.get("referrer-policy") == "no-referrer", (path, headers)


class _Inline(html.parser.HTMLParser):
    """The inline scripts and style sheets of a page, and anything else a CSP would refuse."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.scripts, self.styles, self.refused, self._open = [], [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.refused += [f"<{tag} {name}=...>" for name in attrs if name == "style" or name.startswith("on")]
        if tag == "script" and "src" in attrs:
            self.refused.append("<script src>")
        if tag == "style" or (tag == "script" and attrs.get("type") in (None, "text/javascript", "module")):
            self._open = (tag, [])

    def handle_data(self, data):
        if self._open:
            self._open[1].append(data)

    def handle_endtag(self, tag):
        if self._open and tag == self._open[0]:
            (self.scripts if tag == "script" else self.styles).append("".join(self._open[1]))
            self._open = None


def _sources(policy: str, directive: str) -> set[str]:
    found = next(d for d in policy.split(";") if d.split()[0] == directive)
    return set(found.split()[1:])


def test_the_policy_allows_every_inline_script_and_style_of_the_pages_and_nothing_inline_else(served):
    from ludus.pages import csp_hash

    policy = dict(security_headers())[b"content-security-policy"].decode()
    data = {"game": GAME, "total_matches": 3, "scheduler": {"running": True},
            "rows": [{"rank": 1, "player_id": "a", "submission_kind": "python", "mu": 26.0, "low": 20.0,
                      "high": 32.0, "conservative": 8.0, "games": 3, "wins": 2, "draws": 0, "losses": 1,
                      "faults": {"timeout": 1}}],
            "head_to_head": {"players": ["a"], "games": [[0]], "score": [[0.0]]},
            "recent": [{"id": 7, "players": ["a", "b"], "returns": [1, -1], "statuses": ["ok", "timeout"],
                        "moves": 5}]}
    pages = {"/ (with rows)": leaderboard_page(data, 4)}
    for path in ("/", "/submit", "/entrants/random", "/matches/0"):
        pages[path] = served.request("GET", path)[2].decode()
    for path, text in pages.items():
        inline = _Inline()
        inline.feed(text)
        assert inline.refused == [], (path, inline.refused)
        assert inline.styles and (bool(inline.scripts) == (path != "/entrants/random")), (path, inline.scripts)
        for script in inline.scripts:
            assert csp_hash(script) in _sources(policy, "script-src"), (path, script[:80])
        for style in inline.styles:
            assert csp_hash(style) in _sources(policy, "style-src"), (path, style[:80])


def test_the_pages_run_under_the_policy_in_a_browser(served):
    from tests.test_arena_service_browser import Browser

    browser = Browser()
    try:
        browser.command("Page.addScriptToEvaluateOnNewDocument", source=(
            "window.__csp = []; document.addEventListener('securitypolicyviolation', function (e) {"
            " window.__csp.push(e.violatedDirective + ' ' + e.blockedURI); });"))
        base = f"http://127.0.0.1:{served.port}"
        for path in ("/", "/entrants/random", "/submit", "/matches/0"):
            browser.goto(base + path)
            assert browser.evaluate("Array.isArray(window.__csp)"), path  # the listener is in place
            if path == "/submit":  # its inline script runs: it answers a submit without a file
                browser.evaluate("document.getElementById('upload').dispatchEvent(new Event('submit', "
                                 "{cancelable: true})); true")
                browser.wait_for("document.getElementById('result').textContent === 'choose an archive first'",
                                 timeout=10)
            if path == "/matches/0":  # the player's inline script runs: it shows step 0
                browser.wait_for("document.querySelector('.ludus-replay .board').textContent.length > 0", timeout=10)
            assert browser.evaluate("getComputedStyle(document.body).maxWidth") == "1100px", path  # the sheet applies
            assert browser.evaluate("window.__csp") == [], (path, browser.evaluate("window.__csp"))
        # and the policy is in force: a style injected now is refused and reported
        browser.evaluate("var s = document.createElement('style'); s.textContent = 'p {}'; "
                         "document.head.appendChild(s); true")
        browser.wait_for("window.__csp.length > 0", timeout=10)
    finally:
        browser.close()


# ---------------------------------------------------------------------------------- rate limiting


def test_failed_authentications_are_limited_per_client_address(arena_dir, tmp_path):
    with Served(arena_dir, auth_failures_burst=5, auth_failures_per_minute=60) as served:
        good = token(arena_dir)
        for _ in range(20):  # successful authentications take nothing from the bucket
            status, _, body = served.request("POST", "/api/submissions?name=x", b"", token=good)
            assert status == 400 and b"empty" in body
        statuses = [served.request("POST", "/api/submissions?name=x", b"x", token="ludus_wrong")[0]
                    for _ in range(5)]
        assert statuses == [401] * 5
        status, headers, body = served.request("POST", "/api/submissions?name=x", b"x", token="ludus_wrong")
        assert status == 429 and 1 <= int(headers["retry-after"]) <= 2, (status, headers)
        assert "try again in" in json.loads(body)["error"]
        # an empty bucket refuses before the token is looked at: a right guess learns nothing
        assert served.request("POST", "/api/submissions?name=x", b"", token=good)[0] == 429
        assert served.request("POST", "/api/entrants/random/withdraw", token="ludus_wrong")[0] == 429
        # another address has its own bucket
        assert served.request("POST", "/api/submissions?name=x", b"x", token="ludus_wrong", source="127.0.0.2")[0] == 401
        time.sleep(int(headers["retry-after"]))  # one try earned back per second
        assert served.request("POST", "/api/submissions?name=x", b"", token=good)[0] == 400


# --------------------------------------------------------------------------------------- timeouts


def _closed_by_server(sock: socket.socket, within: float) -> bytes:
    """What the server sends before it closes `sock`; fails if it is still open after `within` s."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        pytest.fail(f"the server held the connection for more than {within} s (received {received[:200]!r})")
    except ConnectionResetError:
        pass
    return received


def test_half_open_connections_are_closed_at_the_read_deadlines(arena_dir):
    with Served(arena_dir, header_timeout_s=1.0, body_timeout_s=1.5) as served:
        silent = socket.create_connection(("127.0.0.1", served.port))
        partial = socket.create_connection(("127.0.0.1", served.port))
        partial.sendall(b"GET /api/leaderboard HTTP/1.1\r\nHost: x\r\n")
        trickle = socket.create_connection(("127.0.0.1", served.port))
        trickle.sendall(b"GET / HTTP/1.1\r\n")
        for k in range(12):  # a header line every 0.3 s: the deadline is for all headers, not between bytes
            if select.select([trickle], [], [], 0.3)[0]:  # the server answered (and closes): stop sending
                break
            trickle.sendall(f"X-{k}: slow\r\n".encode())
        else:
            pytest.fail("a connection trickling header lines was held for 3.6 s (header deadline 1 s)")
        for sock in (silent, partial, trickle):
            answer = _closed_by_server(sock, within=4.0)
            assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer, answer
            sock.close()

        # a body that stops: the connection is closed and the upload's directory removed
        body = socket.create_connection(("127.0.0.1", served.port))
        body.sendall(f"POST /api/submissions?name=slow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     f"{token(arena_dir)}\r\nContent-Length: 100000\r\n\r\n".encode() + b"PK" * 50)
        _closed_by_server(body, within=5.0)
        body.close()
        deadline = time.monotonic() + 10
        while [p.name for p in (arena_dir / "incoming").iterdir() if p.name != ".lock"]:
            assert time.monotonic() < deadline, list((arena_dir / "incoming").iterdir())
            time.sleep(0.1)

        # a healthy keep-alive client outlives both deadlines on one connection
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        for _ in range(6):
            connection.request("GET", "/api/leaderboard")
            response = connection.getresponse()
            assert response.status == 200 and response.read().startswith(b"{")
            time.sleep(0.6)
        connection.close()


# ----------------------------------------------------------------------------------- upload errors


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buffer.getvalue()


def test_upload_refusals_name_the_uploads_own_files_not_server_paths(served, arena_dir):
    for archive, expected in ((_zip({"bot/agent.toml": b"not toml ["}), "malformed manifest bot/agent.toml"),
                              (_zip({"bot/agent.py": b"x = 1\n"}), "bot has no agent.toml")):
        status, _, body = served.request("POST", "/api/submissions?name=paths", archive, token=token(arena_dir))
        message = json.loads(body)["error"]
        assert status == 400 and expected in message, message
        for server_path in (str(arena_dir), str(arena_dir.resolve()), "/incoming/", "upload-", "/tmp/"):
            assert server_path not in message, (server_path, message)


def test_scrubbing_keeps_archive_names_and_shortens_other_server_paths(tmp_path):
    import tempfile

    work = tmp_path / "arena" / "incoming" / "upload-abc"
    sandbox = Path(tempfile.gettempdir()) / "ludus-box-1" / "copy" / "agent.py"
    message = (f"malformed manifest {work}/unpacked/bot/agent.toml: no; {work}/unpacked has no agent.toml; "
               f"crashed: File \"{sandbox}\", line 3; archive member '/etc/passwd' is an absolute path")
    assert scrub_paths(message, work) == ("malformed manifest bot/agent.toml: no; the upload has no agent.toml; "
                                          "crashed: File \"agent.py\", line 3; archive member '/etc/passwd' is an "
                                          "absolute path")


# ------------------------------------------------------------------------------ stale upload dirs


def test_uploads_left_by_a_killed_service_are_removed_at_start_unless_a_live_service_owns_them(tmp_path):
    arena = Arena.open(tmp_path / "arena", GAME)
    arena.create()
    incoming = tmp_path / "arena" / "incoming"
    stale = incoming / "upload-killed" / "unpacked" / "bot"
    stale.mkdir(parents=True)
    (stale / "agent.py").write_text("x = 1\n")
    os.chmod(stale, 0o500)  # read-only, as a sandbox check may leave a copy
    first = ArenaService(arena, ServiceConfig(schedule=False))
    assert sorted(p.name for p in incoming.iterdir()) == [".lock"]
    live = first.incoming()  # an upload of the first service, in progress
    second = ArenaService(arena, ServiceConfig(schedule=False))  # another service on the same arena
    assert live.is_dir()
    second.close()
    first.close()
    ArenaService(arena, ServiceConfig(schedule=False)).close()  # both gone: a restart cleans up
    assert not live.exists()
