"""`ludus arena serve` over HTTP with a real server on loopback (a `ludus` process, as an operator
starts it): authentication, hostile uploads, versions and withdrawal, the scheduler's placement
games, and a kill -9 in the middle of play."""

from __future__ import annotations

import http.client
import io
import json
import signal
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from ludus.arena import testing
from ludus.arena.testing import ServiceProcess, run_ludus
from ludus.league.records.ledger import Store
from tests.test_arena import require_isolation

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "agents"
GAME = "tic_tac_toe"


def uploads_left(arena_dir: Path) -> list[Path]:
    """What uploads left in `incoming/` (its `.lock` says a service is live: not an upload)."""
    return [p for p in (arena_dir / "incoming").iterdir() if p.name != ".lock"]


def agent_zip(folder: Path = EXAMPLES / "random_python", extra: list[tuple[str, bytes]] = ()) -> bytes:
    return testing.agent_zip(folder, extra)


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """An arena with two bots and two accounts, served with the scheduler on."""
    require_isolation()
    root = tmp_path_factory.mktemp("service")
    arena_dir = root / "arena"
    alice = run_ludus("arena", "token", "add", "alice", "--game", GAME, "--arena", str(arena_dir)).stdout.split()[-1]
    mallory = run_ludus("arena", "token", "add", "mallory", "--arena", str(arena_dir)).stdout.split()[-1]
    run_ludus("arena", "submit", "bot:random", "--arena", str(arena_dir))
    run_ludus("arena", "submit", "bot:mcts-10", "--arena", str(arena_dir))
    server = ServiceProcess(arena_dir, "--placement-games", "4", "--uploads-per-hour", "12").start()
    yield {"server": server, "alice": alice, "mallory": mallory, "root": root, "arena": arena_dir}
    server.stop()


def entrants(arena_dir: Path) -> list[str]:
    with Store.open(arena_dir, mode="read") as store:
        return [p.player_id for p in store.players()]


def test_writes_need_a_valid_token(service):
    server, arena_dir = service["server"], service["arena"]
    before = entrants(arena_dir)
    archive = agent_zip()
    for token in (None, "nonsense", "ludus_" + "x" * 43, service["alice"] + "x"):
        status, body = server.upload("eve", archive, token)
        assert status == 401 and "token" in body["error"], (token, status, body)
    status, _ = server.request("POST", "/api/entrants/random/withdraw")
    assert status == 401
    assert entrants(arena_dir) == before
    assert uploads_left(arena_dir) == []


def _hostile_archives(root: Path) -> dict[str, bytes]:
    out = {}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:  # ~100 MiB of zeros in ~100 KiB
        z.writestr("agent.toml", b"x")
        z.writestr("zeros", b"\0" * (100 << 20))
    out["zip bomb"] = buffer.getvalue()
    out["path traversal"] = agent_zip(extra=[("../../escaped.py", b"print('out')")])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for i in range(10_000):
            z.writestr(f"bot/f{i}", b"")
    out["10,000 files"] = buffer.getvalue()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as t:
        link = tarfile.TarInfo("bot/escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(root / "outside")
        t.addfile(link)
        evil = tarfile.TarInfo("bot/escape/evil.py")
        evil.size = 4
        t.addfile(evil, io.BytesIO(b"boom"))
    out["symlink out"] = buffer.getvalue()
    return out


def test_hostile_uploads_are_refused_and_nothing_is_written_outside(service):
    server, arena_dir, root = service["server"], service["arena"], service["root"]
    (root / "outside").mkdir(exist_ok=True)
    before = entrants(arena_dir)
    expected = {"zip bomb": "zip bomb", "path traversal": "climbs out", "10,000 files": "more than 2000",
                "symlink out": "symlink"}
    for kind, archive in _hostile_archives(root).items():
        status, body = server.upload("eve", archive, service["mallory"])
        assert status == 400 and expected[kind] in body["error"], (kind, status, body)
        assert "\n" not in body["error"]
    assert entrants(arena_dir) == before
    assert list((root / "outside").iterdir()) == [] and not (root / "escaped.py").exists()
    assert not (arena_dir.parent / "escaped.py").exists()
    assert uploads_left(arena_dir) == []


def test_a_1_gb_upload_is_refused_without_being_read(service):
    server = service["server"]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.putrequest("POST", "/api/submissions?name=huge")
    connection.putheader("Authorization", f"Bearer {service['mallory']}")
    connection.putheader("Content-Length", str(1 << 30))
    connection.endheaders()
    connection.send(b"\0" * (1 << 20))  # the first MiB of a gigabyte; the server answers before the rest
    response = connection.getresponse()
    assert response.status == 413 and "larger than 64 MiB" in json.loads(response.read())["error"]
    connection.close()
    # without a Content-Length (chunked), the stream is cut at the cap
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)

    def chunks():
        for _ in range(80):
            yield b"\0" * (1 << 20)

    connection.request("POST", "/api/submissions?name=huge", body=chunks(), encode_chunked=True,
                       headers={"Authorization": f"Bearer {service['mallory']}", "Transfer-Encoding": "chunked"})
    response = connection.getresponse()
    assert response.status == 413
    connection.close()
    assert uploads_left(service["arena"]) == []


def test_an_upload_is_validated_versioned_placed_and_withdrawn(service):
    server, alice, mallory = service["server"], service["alice"], service["mallory"]
    status, body = server.upload("bob", agent_zip(), alice)
    assert status == 201 and body["player_id"] == "bob@1" and body["kind"] == "python", body
    status, body = server.upload("bob", agent_zip(EXAMPLES / "random_sh"), alice)
    assert status == 201 and body["player_id"] == "bob@2", body
    status, body = server.upload("bob", agent_zip(), mallory)  # another account's name (tests/test_arena_names.py)
    assert status == 409 and "belongs to account 'alice'" in body["error"]
    status, body = server.upload("carol", agent_zip(), mallory)  # the same content: entered, with a warning
    assert status == 201 and "bob@1" in body.get("warning", ""), body
    status, body = server.upload("broken", agent_zip(extra=[("broken/agent.toml", b"not toml [")]), mallory)
    assert status == 400 and body["error"]

    deadline = time.monotonic() + 240  # placement: 4 games each, before the ladder
    while time.monotonic() < deadline:
        board = server.get("/api/leaderboard")[1]
        games = {r["player_id"]: r["games"] for r in board["rows"]}
        if all(games.get(p, 0) >= 4 for p in ("bob@1", "bob@2", "carol@1")):
            break
        time.sleep(1)
    else:
        pytest.fail(f"placement games not played in 240 s: {games}")
    row = next(r for r in board["rows"] if r["player_id"] == "bob@1")
    assert row["low"] < row["mu"] < row["high"] and row["wins"] + row["draws"] + row["losses"] == row["games"]
    match_id = board["recent"][0]["id"]
    status, match = server.get(f"/api/matches/{match_id}")
    assert status == 200 and match["id"] == match_id
    status, episode = server.get(f"/api/matches/{match_id}/episode")
    assert status == 200 and len(episode["steps"]) == match["moves"] + 1 and episode["players"] == match["players"]
    status, entrant = server.get("/api/entrants/bob@1")
    assert status == 200 and entrant["account"] == "alice" and entrant["history"]

    status, body = server.request("POST", "/api/entrants/bob@1/withdraw", token=mallory)
    assert status == 403 and "not an entrant of account 'mallory'" in body["error"]
    status, body = server.request("POST", "/api/entrants/bob@1/withdraw", token=alice)
    assert status == 200 and body["withdrawn"]
    board = server.get("/api/leaderboard")[1]
    assert "bob@1" not in {r["player_id"] for r in board["rows"]}
    assert server.get("/api/entrants/bob@1")[1]["withdrawn"]
    assert server.get("/api/entrants/nobody")[0] == 404


def test_pages_render(service):
    server = service["server"]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    for path, marker in (("/", 'id="summary"'), ("/submit", 'id="upload"'), ("/entrants/random", 'id="history"')):
        connection.request("GET", path)
        response = connection.getresponse()
        text = response.read().decode()
        assert response.status == 200 and marker in text and "<script src" not in text, path


def test_uploads_per_hour_are_limited(service, tmp_path):
    server = service["server"]
    codes = [server.upload("spam", b"not an archive", service["mallory"])[0] for _ in range(14)]
    assert 429 in codes and codes.index(429) <= 12  # 12 per hour per account (other tests used some)
    status, body = server.upload("spam", b"x", service["mallory"])
    assert status == 429 and "try again in" in body["error"]


def test_the_scheduler_survives_kill_9_without_losing_or_duplicating_a_match(tmp_path):
    require_isolation()
    arena_dir = tmp_path / "arena"
    run_ludus("arena", "submit", "bot:random", "--game", GAME, "--arena", str(arena_dir))
    run_ludus("arena", "submit", "bot:mcts-10", "--arena", str(arena_dir))
    run_ludus("arena", "submit", str(EXAMPLES / "random_python"), "--arena", str(arena_dir))

    def ledger() -> dict[int, tuple]:
        with Store.open(arena_dir, mode="read") as store:
            return {m.result.match_id: (m.seq, m.result.seed, m.result.moves, tuple(s.episode_return for s in m.result.seats))
                    for m in store.iter_matches()}

    server = ServiceProcess(arena_dir).start()
    deadline = time.monotonic() + 120
    while len(ledger()) < 20 and time.monotonic() < deadline:
        time.sleep(0.2)
    server.stop(signal.SIGKILL)  # in the middle of a round
    before = ledger()
    assert len(before) >= 20
    server = ServiceProcess(arena_dir).start()
    deadline = time.monotonic() + 120
    while len(ledger()) < len(before) + 20 and time.monotonic() < deadline:
        time.sleep(0.2)
    server.stop()
    after = ledger()
    assert len(after) >= len(before) + 20
    assert {k: after[k] for k in before} == before  # nothing recorded before the kill changed or went
    seqs = sorted(seq for seq, *_ in after.values())
    assert seqs == list(range(1, len(after) + 1))  # every match once, none twice
    assert min(set(after) - set(before)) > max(before)
    # the stored ratings are exactly the ledger's replay (no half-recorded match)
    from ludus.league.records.ratings import load_params, rebuild_ratings

    with Store.open(arena_dir, mode="read") as store:
        rebuilt = rebuild_ratings(store, load_params(store), kinds=("arena",)).as_dict()
        stored = {pid: (r.mu, r.sigma) for pid, r in store.latest_ratings().items()}
    assert {pid: (r.mu, r.sigma) for pid, r in rebuilt.items()} == stored
