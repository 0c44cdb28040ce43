"""Entrant names and scheduling of the arena service (issue 74, items 4 and 5): one namespace of
names for the operator and the accounts, compared ignoring case, claimed only by an entry that
succeeds; old stores read as before; dead entrants out of the schedule."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ludus.arena import testing
from ludus.arena.accounts import (NAMES_KEY, NameTakenError, NotYoursError, check_name_free, dead, entrant_owners,
                            name_claims, scheduled_entrants, withdraw)
from ludus.arena.api import Arena
from ludus.arena.scheduler import Scheduler, SchedulerSettings
from ludus.arena.store import Entrant
from ludus.arena.submission import SubmissionKind
from ludus.arena.testing import ServiceProcess, run_ludus
from ludus.league.records.ledger import Store
from tests.test_arena import ZOO, config, require_isolation

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "agents"
GAME = "tic_tac_toe"


def player_ids(arena_dir: Path) -> list[str]:
    with Store.open(arena_dir, mode="read") as store:
        return [p.player_id for p in store.players()]


def one_line_error(status: int, body: dict, expected: int, *words: str) -> None:
    assert status == expected, (status, body)
    assert set(body) == {"error"} and "\n" not in body["error"], body
    for word in words:
        assert word in body["error"], (word, body)


# ------------------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """An arena with an operator's Python entrant and bot, two accounts, served without the scheduler."""
    require_isolation()
    arena_dir = tmp_path_factory.mktemp("names") / "arena"
    alice = run_ludus("arena", "token", "add", "alice", "--game", GAME, "--arena", str(arena_dir)).stdout.split()[-1]
    mallory = run_ludus("arena", "token", "add", "mallory", "--arena", str(arena_dir)).stdout.split()[-1]
    run_ludus("arena", "submit", str(EXAMPLES / "random_python"), "--arena", str(arena_dir))  # random-python
    run_ludus("arena", "submit", "bot:random", "--arena", str(arena_dir))
    server = ServiceProcess(arena_dir, "--no-schedule").start()
    yield {"server": server, "alice": alice, "mallory": mallory, "arena": arena_dir}
    server.stop()


def test_an_account_cannot_take_over_an_operator_name(served):
    server, alice, arena_dir = served["server"], served["alice"], served["arena"]
    before = player_ids(arena_dir)
    assert before == ["random-python", "random"]
    for name in ("random-python", "Random-PYTHON", "random"):
        status, body = server.upload(name, testing.agent_zip(EXAMPLES / "random_python"), alice)
        one_line_error(status, body, 409, "belongs to the operator")
    for entrant in ("random-python", "random"):
        status, body = server.request("POST", f"/api/entrants/{entrant}/withdraw", token=alice)
        one_line_error(status, body, 403, "entered by the operator")
    assert player_ids(arena_dir) == before
    status, entrant = server.get("/api/entrants/random-python")
    assert status == 200 and entrant["account"] is None and entrant["entered_by"] == "operator"
    assert not entrant["withdrawn"]
    status, page = server.request("GET", "/entrants/random-python")
    assert status == 200 and '<span id="owner">entered by the operator</span>' in page["text"]


def test_names_are_one_namespace_ignoring_case(served):
    server, alice, mallory, arena_dir = served["server"], served["alice"], served["mallory"], served["arena"]
    archive = testing.agent_zip(EXAMPLES / "random_python")
    status, body = server.upload("bobbot", archive, alice)
    assert status == 201 and body["player_id"] == "bobbot@1" and body["account"] == "alice", body
    status, body = server.upload("BOBBOT", archive, mallory)
    one_line_error(status, body, 409, "'BOBBOT' belongs to account 'alice'", "'bobbot'", "ignoring case")
    # the owner's own other spelling is the next version, spelt as the name's first entry
    status, body = server.upload("BobBot", testing.agent_zip(EXAMPLES / "random_sh"), alice)
    assert status == 201 and body["player_id"] == "bobbot@2" and body["version"] == 2, body
    # the operator is held to the same namespace
    refused = run_ludus("arena", "submit", "bot:random", "--name", "BOBBOT", "--arena", str(arena_dir), check=False)
    assert refused.returncode != 0 and "belongs to account 'alice'" in refused.stderr, refused
    assert [p for p in player_ids(arena_dir) if p.casefold().startswith("bobbot")] == ["bobbot@1", "bobbot@2"]
    status, body = server.request("POST", "/api/entrants/bobbot@1/withdraw", token=mallory)
    one_line_error(status, body, 403, "not an entrant of account 'mallory'", "entered by account 'alice'")
    assert not server.get("/api/entrants/bobbot@1")[1]["withdrawn"]
    status, body = server.request("POST", "/api/entrants/bobbot@1/withdraw", token=alice)
    assert status == 200 and body["withdrawn"], body
    status, entrant = server.get("/api/entrants/bobbot@2")
    assert entrant["account"] == "alice" and entrant["entered_by"] == "account"


def test_a_refused_upload_claims_nothing(served):
    server, alice, mallory, arena_dir = served["server"], served["alice"], served["mallory"], served["arena"]
    archive = testing.agent_zip(EXAMPLES / "random_python")
    before = player_ids(arena_dir)
    status, body = server.upload("honest%0A", archive, alice)  # `$` used to accept the trailing newline
    one_line_error(status, body, 400, "must be letters")
    status, body = server.upload("careful", testing.agent_zip(ZOO / "crash_at_import"), alice)
    one_line_error(status, body, 400, "hostile crash at import")  # refused by the sandboxed check
    assert player_ids(arena_dir) == before
    for name in ("honest", "careful"):  # both names are still free: another account takes them
        status, body = server.upload(name, archive, mallory)
        assert status == 201 and body["player_id"] == f"{name}@1" and body["account"] == "mallory", body
    status, body = server.upload("Honest", archive, alice)
    one_line_error(status, body, 409, "belongs to account 'mallory'")


# ------------------------------------------------------------------------ stores from before owners


def _old_entrant(player_id: str, kind: str = "submission") -> Entrant:
    """An entrant row as Ludus wrote it before rows recorded their owner (no entered_by)."""
    if kind == "bot":
        return Entrant(player_id, "bot", SubmissionKind.BUILTIN, "builtin", "builtin:random", "", 1.0, bot="random")
    return Entrant(player_id, "submission", SubmissionKind.PYTHON_FOLDER, "1", "d" * 64, "submissions/x", 1.0,
                   entry_point="agent:Agent")


def test_an_old_store_reads_its_owners_and_its_stolen_names_stay_the_operators(tmp_path):
    with Store.open(tmp_path, mode="write") as store:
        for entrant in (_old_entrant("random-python"), _old_entrant("random", "bot"), _old_entrant("bob@1"),
                        _old_entrant("random-python@1"), _old_entrant("BOB@1")):
            record = entrant.to_record()
            assert "entered_by" not in record.metadata
            store.add_player(record)
        # the old claims: alice took the operator's name, mallory a case variant of alice's, and
        # "ghost" was claimed by an upload that was then refused
        store.set_meta(NAMES_KEY, {"bob": "alice", "random-python": "alice", "BOB": "mallory", "ghost": "eve"})
    with Store.open(tmp_path, mode="read") as store:
        owners = entrant_owners(store)
        claims = name_claims(store)
        assert owners == {"random-python": None, "random": None, "bob@1": "alice", "random-python@1": "alice",
                          "BOB@1": "mallory"}
        assert {k: c.account for k, c in claims.items()} == {"random-python": None, "random": None, "bob": "alice"}
        assert check_name_free(store, "ghost", "mallory") is None  # a refused upload's claim is no claim
        with pytest.raises(NameTakenError, match="belongs to the operator"):
            check_name_free(store, "random-python", "alice")
        with pytest.raises(NameTakenError, match="belongs to account 'alice'"):
            check_name_free(store, "bob", "mallory")
    with Store.open(tmp_path, mode="write") as store:
        with pytest.raises(NotYoursError, match="entered by the operator"):
            withdraw(store, "random-python", "alice")
        withdraw(store, "random-python@1", "alice")  # hers, even under the operator's name
        withdraw(store, "BOB@1", "mallory")
        withdraw(store, "random")  # the operator may withdraw anything
        assert [e.player_id for e in scheduled_entrants(store)] == ["random-python", "bob@1"]


def test_the_operator_and_accounts_share_names_in_process(tmp_path):
    arena = Arena.open(tmp_path / "arena", game=GAME)
    arena.submit("bot:random")
    bot = arena.validate("bot:mcts-10", GAME)
    with pytest.raises(NameTakenError):
        arena.enter(bot, "RANDOM", "alice", new_version=True)
    first = arena.enter(bot, "Mine", "alice", new_version=True)
    assert (first.player_id, first.entered_by, first.account) == ("Mine@1", "account", "alice")
    assert arena.enter(bot, "mine", "alice", new_version=True).player_id == "Mine@2"
    with pytest.raises(NameTakenError, match="belongs to account 'alice'"):
        arena.submit("bot:perfect", name="MINE")
    assert arena.submit("bot:perfect", name="Random").entered_by == "operator"  # the operator's own name
    assert [e.player_id for e in arena.list()] == ["random", "Mine@1", "Mine@2", "Random"]


# ------------------------------------------------------------------------------------ scheduling


def _matches_of(arena_dir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with Store.open(arena_dir, mode="read") as store:
        for match in store.iter_matches(kinds=("arena",)):
            for pid in set(match.result.player_ids):
                counts[pid] = counts.get(pid, 0) + 1
    return counts


def test_dead_entrants_are_never_scheduled_again(tmp_path):
    require_isolation()
    arena = Arena.open(tmp_path / "arena", game=GAME, config=config())
    arena.submit("bot:random")
    arena.submit("bot:mcts-10")
    crasher = arena.validate(ZOO / "crash_mid_game", GAME)  # raises on its second move, every match
    arena.enter(crasher, "crashy", "alice", new_version=True)
    arena.enter(crasher, "wreck", "mallory", new_version=True)
    crashers = {"crashy@1", "wreck@1"}
    settings = SchedulerSettings(placement_games=2, pairs_per_round=2, workers=1, seed=3)
    per_round = 2 * settings.pairs_per_round  # matches in a round at most
    budget = config().sandbox_limits.max_faults  # faulty matches that kill an agent at the latest
    lock = threading.Lock()

    def died() -> set[str]:
        with Store.open(arena.directory, mode="read") as store:
            return set(dead(store))

    scheduler = Scheduler(arena, settings, lock)
    try:
        for _ in range(20):
            if died() >= crashers:
                break
            assert scheduler.run_round() > 0
        assert died() == crashers, _matches_of(arena.directory)
        at_death = _matches_of(arena.directory)
        # 3 faulty matches in a row (or `budget` in all) kill an agent; a match against the other
        # crasher can end before it faults; the rest of the round it dies in is still played
        for pid in crashers:
            assert 3 <= at_death[pid] <= 2 * budget + per_round - 1, at_death
        with Store.open(arena.directory, mode="read") as store:
            assert all("faulty matches" in d.why for d in dead(store).values())
        played = [scheduler.run_round() for _ in range(6)]
        assert all(n > 0 for n in played), played  # the honest two play on, every round
        after = _matches_of(arena.directory)
        assert {pid: after[pid] for pid in crashers} == {pid: at_death[pid] for pid in crashers}
        assert after["random"] - at_death.get("random", 0) == sum(played)  # every match: random vs mcts-10
        assert after["mcts-10"] - at_death.get("mcts-10", 0) == sum(played)
        assert not crashers & set(scheduler.players)  # their processes were shut down
    finally:
        scheduler.close()

    # a restarted service reads the deaths back; a new version of the name enters and plays
    revived = arena.enter(arena.validate(EXAMPLES / "random_python", GAME), "crashy", "alice", new_version=True)
    assert revived.player_id == "crashy@2"
    scheduler = Scheduler(arena, settings, lock)
    try:
        for _ in range(4):
            assert scheduler.run_round() > 0
    finally:
        scheduler.close()
    final = _matches_of(arena.directory)
    assert {pid: final[pid] for pid in crashers} == {pid: at_death[pid] for pid in crashers}
    assert final["crashy@2"] >= settings.placement_games
    with Store.open(arena.directory, mode="read") as store:
        assert "crashy@2" not in dead(store)
