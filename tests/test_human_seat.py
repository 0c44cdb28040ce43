"""A person's seat over HTTP: the play API of `ludus arena serve` (a real server on loopback, as an
operator starts it) against a sandboxed entrant and a bot — refusals, a whole game recorded, rated
and replayable, an abandoned game forfeited — and `ludus play --web`'s local server on a text-move
game. The browser path is tests/test_human_seat_browser.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ludus.arena.testing import ServiceProcess, free_port, run_ludus
from tests.test_arena_service import EXAMPLES, GAME, require_isolation

TIMEOUT_S = 6.0
"""The server's web-seat move timeout here (short, so that abandoning a game takes seconds)."""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A tic-tac-toe arena with a bot and a sandboxed Python entrant, two accounts, no scheduler."""
    require_isolation()
    arena_dir = tmp_path_factory.mktemp("human") / "arena"
    alice = run_ludus("arena", "token", "add", "alice", "--game", GAME, "--arena", str(arena_dir)).stdout.split()[-1]
    mallory = run_ludus("arena", "token", "add", "mallory", "--arena", str(arena_dir)).stdout.split()[-1]
    run_ludus("arena", "submit", "bot:random", "--arena", str(arena_dir))
    run_ludus("arena", "submit", str(EXAMPLES / "random_python"), "--name", "randy", "--arena", str(arena_dir))
    server = ServiceProcess(arena_dir, "--no-schedule", "--human-move-timeout", str(TIMEOUT_S)).start()
    yield {"server": server, "alice": alice, "mallory": mallory, "arena": arena_dir}
    server.stop()


def post(server, path: str, body, token: str | None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return server.request("POST", path, data, token, {"Content-Type": "application/json"})


def get(server, path: str, token: str | None) -> tuple[int, dict]:
    return server.request("GET", path, None, token)


def play_out(server, state: dict, token: str, deadline_s: float = 60.0) -> dict:
    """Play the first legal move whenever it is the person's turn, until the game is over."""
    end = time.monotonic() + deadline_s
    while state["status"] not in ("over", "failed"):
        assert time.monotonic() < end, state
        if state["status"] == "your-turn":
            move = state["legal"][0]
            status, state = post(server, f"/api/play/{state['game_id']}/move", {"action": move["action"]}, token)
            assert status == 200, state
        else:
            time.sleep(0.1)
            status, state = get(server, f"/api/play/{state['game_id']}", token)
            assert status == 200, state
    return state


def test_the_play_api_refuses_what_it_cannot_take(service):
    server, alice = service["server"], service["alice"]
    assert post(server, "/api/play", {"opponent": "randy", "seat": 0}, None)[0] == 401
    assert post(server, "/api/play", {"opponent": "randy", "seat": 0}, "ludus_nonsense")[0] == 401
    for body, status, words in [
        (b"{not json", 400, "not JSON"),
        ([1, 2], 400, "JSON object"),
        ({"opponent": "randy", "seat": 2}, 400, "seat must be"),
        ({"opponent": "randy", "seat": True}, 400, "seat must be"),
        ({"opponent": "randy", "seat": 0, "admin": 1}, 400, "unknown field"),
        ({"opponent": "nobody", "seat": 0}, 404, "no entrant 'nobody'"),
        ({"opponent": "x" * 300, "seat": 0}, 400, "at most 200"),
        ({"seat": 0}, 400, "name the entrant"),
        (b"{" + b" " * (20 << 10) + b"}", 413, "larger than"),
    ]:
        got, answer = post(server, "/api/play", body, alice)
        assert got == status and words in answer["error"] and "\n" not in answer["error"], (body[:40], got, answer)
    assert get(server, "/api/play/no-such-game", alice)[0] == 404


def test_a_person_plays_a_sandboxed_entrant_and_is_rated_on_the_leaderboard(service):
    server, alice, mallory = service["server"], service["alice"], service["mallory"]
    status, state = post(server, "/api/play", {"opponent": "randy", "seat": 1}, alice)  # randy moves first
    assert status == 201, state
    assert state["players"] == ["randy", "human:alice"] and state["layout"] == {"rows": 3, "cols": 3, "click": "cell"}
    game = state["game_id"]
    # nobody else may read or move in it, and alice has one game at a time
    assert get(server, f"/api/play/{game}", mallory)[0] == 403
    assert post(server, f"/api/play/{game}/move", {"action": 4}, mallory)[0] == 403
    assert post(server, "/api/play", {"opponent": "random", "seat": 0}, alice)[0] == 409
    while state["status"] != "your-turn":
        time.sleep(0.1)
        state = get(server, f"/api/play/{game}", alice)[1]
    taken = next(i for i, c in enumerate("".join(state["grid"])) if c != ".")  # randy's first mark
    for body, words in [({"action": taken}, "not legal"), ({"action": 9}, "not legal"), ({"action": "4"}, "whole"),
                        ({"text": "[4]"}, "action numbers"), ({}, "one move"), ({"action": 1, "text": "1"}, "one move"),
                        ({"move": 4}, "JSON object")]:
        got, answer = post(server, f"/api/play/{game}/move", body, alice)
        assert got == 400 and words in answer["error"], (body, got, answer)
    state = play_out(server, state, alice)
    assert state["status"] == "over" and state["statuses"] == ["ok", "ok"], state
    assert post(server, f"/api/play/{game}/move", {"action": 0}, alice)[0] == 409
    match_id = state["match_id"]

    status, match = get(server, f"/api/matches/{match_id}", None)
    assert status == 200 and match["players"] == ["randy", "human:alice"] and match["statuses"] == ["ok", "ok"]
    assert match["returns"] == state["returns"]
    rows = {r["player_id"]: r for r in get(server, "/api/leaderboard", None)[1]["rows"]}
    assert rows["human:alice"]["games"] == 1 and rows["human:alice"]["kind"] == "human"
    assert rows["randy"]["games"] == 1 and rows["random"]["games"] == 0
    person = get(server, "/api/entrants/human:alice", None)[1]
    assert person["account"] == "alice" and [m["id"] for m in person["matches"]] == [match_id]
    assert len(person["history"]) == 1  # rated by the same update as the entrant
    replay = run_ludus("arena", "replay", str(match_id), "--arena", str(service["arena"])).stdout
    assert "human:alice (human)" in replay and "replay check: the moves reproduce the recorded returns" in replay


def test_an_abandoned_game_is_forfeited_after_the_timeout(service):
    server, mallory = service["server"], service["mallory"]
    status, state = post(server, "/api/play", {"opponent": "random", "seat": 0}, mallory)
    assert status == 201 and state["status"] == "your-turn" and 0 < state["seconds_left"] <= TIMEOUT_S, state
    time.sleep(TIMEOUT_S + 0.5)
    end = time.monotonic() + 30
    while state["status"] != "over":
        assert time.monotonic() < end, state
        time.sleep(0.2)
        state = get(server, f"/api/play/{state['game_id']}", mallory)[1]
    assert state["statuses"] == ["timeout", "ok"] and f"did not move within {TIMEOUT_S:g} s" in state["reasons"][0]
    assert state["result"].startswith("you lost")
    rows = {r["player_id"]: r for r in get(server, "/api/leaderboard", None)[1]["rows"]}
    assert rows["human:mallory"]["losses"] == 1 and rows["human:mallory"]["faults"] == {"timeout": 1}


def test_play_web_serves_a_local_game_by_typed_text(tmp_path):
    """`ludus play GAME --against BOT --web`: no accounts, loopback only, a text-move game typed."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "ludus", "play", "ta:TicTacToe-v0", "--against", "random",
                                "--web", "--port", str(port), "--seed", "5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = ServiceProcess(tmp_path, "")
    server.port = port
    try:
        end = time.monotonic() + 60
        while True:
            try:
                status, page = server.get("/")
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < end, process.stderr.read()[-2000:]
                time.sleep(0.2)
        assert status == 200 and 'id="play-config"' in page["text"]
        # a page elsewhere that renamed itself to 127.0.0.1 (DNS rebinding) is not answered
        assert server.request("GET", "/", headers={"Host": "attacker.example"})[0] == 421
        status, state = post(server, "/api/play", {"seat": 0}, None)
        assert status == 201 and state["text_moves"] and state["status"] == "your-turn", state
        assert "Tic Tac Toe" in state["view"] and state["players"] == ["person", "random"]
        game = state["game_id"]
        for body, words in [({"text": ""}, "empty"), ({"text": "x" * 2001}, "at most 2000"),
                            ({"text": "[4]\n[5]"}, "one line")]:
            got, answer = post(server, f"/api/play/{game}/move", body, None)
            assert got == 400 and words in answer["error"], (body, answer)
        status, state = post(server, f"/api/play/{game}/move", {"text": "[4]"}, None)  # typed, judged by the game
        assert status == 200, state
        while state["status"] not in ("over", "failed"):
            if state["status"] == "your-turn":
                state = post(server, f"/api/play/{game}/move", {"text": state["legal"][0]["label"]}, None)[1]
            else:
                time.sleep(0.1)
                state = server.get(f"/api/play/{game}")[1]
        assert state["status"] == "over" and state["match_id"] is None and state["statuses"] == ["ok", "ok"], state
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_persons_minutes_do_not_run_on_the_agents_clock_in_a_simultaneous_game(tmp_path):
    """Goofspiel: both seats bid at once. The person takes three times the agent's whole time
    control over each bid; the sandboxed agent, asked only after the person has moved, never times
    out. In-process (the service's objects without HTTP), so the timing is the test's own."""
    from ludus.agents.human_seat import StartRequest
    from ludus.arena.api import Arena
    from ludus.arena.match import MatchLimits
    from ludus.arena.service import ArenaService, ServiceConfig
    from tests.test_arena import config

    require_isolation()
    game = "spiel:goofspiel(num_cards=3)"
    arena = Arena.open(tmp_path / "arena", game, config(match_limits=MatchLimits(0.3, 0.2)))
    arena.submit(EXAMPLES / "random_python", name="randy")
    service = ArenaService(arena, ServiceConfig(schedule=False))
    try:
        played = service.humans.start("alice", StartRequest(0, "randy"))
        end = time.monotonic() + 60
        while played.finished_at is None:
            assert time.monotonic() < end
            state = played.state("alice")
            if state["status"] == "your-turn":
                time.sleep(1.5)  # three times the agent's 0.3 s + 0.2 s
                played.move("alice", state["legal"][0]["action"])
            time.sleep(0.05)
        state = played.state("alice")
        assert state["status"] == "over" and state["statuses"] == ["ok", "ok"], state
        assert "P0 hand" in state["view"] and state["match_id"] is not None
    finally:
        service.close()
