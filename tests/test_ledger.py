"""The run store: ledger round trips, atomic batches, writer lock, read-only opens, bad files."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

import pytest

from ludus.league.records.ledger import (
    DuplicateMatchError,
    MatchResult,
    PlayerRecord,
    RatingRecord,
    SeatResult,
    Store,
    StoreError,
    StoreLockedError,
    outcomes_from_returns,
)
from ludus.errors import UserError
from ludus.files import atomic_write_bytes, atomic_write_json


def make_match(match_id: int, players=("a", "b"), returns=(1.0, -1.0), kind="rating", teams=None,
               statuses=None) -> MatchResult:
    teams = list(teams) if teams is not None else list(range(len(players)))
    outcomes = outcomes_from_returns(returns, teams)
    statuses = statuses or ["ok"] * len(players)
    seats = tuple(
        SeatResult(seat=i, team=teams[i], player_id=p, episode_return=r, outcome=o, player_version=f"v{match_id}",
                   status=statuses[i], error="" if statuses[i] == "ok" else "boom",
                   metadata={"latency_ms": 1.5} if i == 0 else {})
        for i, (p, r, o) in enumerate(zip(players, returns, outcomes)))
    return MatchResult(match_id=match_id, kind=kind, game_id="connect_four", seed=1000 + match_id, seats=seats,
                       length=7 + match_id % 5, started_at=1.7e9 + match_id, duration_s=0.25,
                       metadata={"method": "pfsp"} if match_id % 2 else {})


def test_outcomes_from_returns_rank_based():
    assert outcomes_from_returns([1.0, -1.0]) == (1.0, 0.0)
    assert outcomes_from_returns([0.0, 0.0]) == (0.5, 0.5)
    # four-player free-for-all with a tie for second: beaten / (n_teams - 1), ties half
    assert outcomes_from_returns([3.0, 1.0, 1.0, 0.0]) == (1.0, 0.5, 0.5, 0.0)
    # two teams of two: team return is the mean of its seats
    assert outcomes_from_returns([2.0, 0.0, 1.0, 0.0], teams=[0, 1, 0, 1]) == (1.0, 0.0, 1.0, 0.0)
    assert outcomes_from_returns([5.0, 7.0], teams=[0, 0]) == (0.5, 0.5)


def test_match_result_validation():
    with pytest.raises(ValueError, match="different outcomes"):
        MatchResult(match_id=1, kind="rating", game_id="g", seed=0, length=1, started_at=0.0, duration_s=0.0,
                    seats=(SeatResult(0, 0, "a", 1.0, 1.0), SeatResult(1, 0, "b", 0.0, 0.0)))
    with pytest.raises(ValueError, match="kind"):
        make_match(1, kind="friendly")
    with pytest.raises(ValueError, match="finite"):
        SeatResult(0, 0, "a", float("nan"), 1.0)


def test_round_trip_filters_and_counts(tmp_path):
    matches = [make_match(10, ("a", "b")), make_match(11, ("b", "c"), (0.0, 0.0), kind="training"),
               make_match(12, ("a", "b", "c"), (1.0, 0.0, 0.0), kind="evaluation"),
               make_match(13, ("c", "a"), (-1.0, 1.0), statuses=["timeout", "ok"])]
    with Store.open(tmp_path / "run") as store:
        assert store.last_seq() == 0 and store.max_match_id() == -1 and store.next_seq() == 1
        assert store.record_matches(matches[:2]) == [1, 2]
        assert store.record_matches(matches[2:]) == [3, 4]
        got = list(store.iter_matches())
        assert [r.seq for r in got] == [1, 2, 3, 4]
        assert [r.result for r in got] == matches
        assert [r.result.match_id for r in store.iter_matches(kinds=["rating"])] == [10, 13]
        assert [r.result.match_id for r in store.iter_matches(player_id="c")] == [11, 12, 13]
        assert [r.result.match_id for r in store.iter_matches(kinds=["rating"], player_id="b")] == [10]
        assert [r.seq for r in store.iter_matches(after_seq=2)] == [3, 4]
        assert store.count_matches() == 4
        assert store.count_matches(kinds=["training", "evaluation"]) == 2
        assert store.count_matches(player_id="a") == 3
        assert store.last_seq() == 4 and store.max_match_id() == 13
        # the ledger view has one row per (match, seat)
        rows = store._connection().execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
        assert rows == 2 + 2 + 3 + 2


def test_counts_up_to_a_seq_stay_exact_as_the_ledger_grows(tmp_path):
    # the store counts incrementally from the last seq it counted; a lower seq is counted afresh
    with Store.open(tmp_path) as store:
        assert store.count_matches_up_to(5) == 0
        store.record_matches([make_match(i) for i in range(3)])
        assert [store.count_matches_up_to(s) for s in (3, 1, 2, 3, 9)] == [3, 1, 2, 3, 3]
        store.record_matches([make_match(i) for i in range(3, 7)])
        assert [store.count_matches_up_to(s) for s in (5, 7, 4, 7)] == [5, 7, 4, 7]
    with Store.open(tmp_path, mode="read") as reader:  # a fresh store counts every row
        assert reader.count_matches_up_to(7) == 7 and reader.count_matches_up_to(6) == 6


def test_duplicate_match_id_rolls_back_whole_batch(tmp_path):
    with Store.open(tmp_path) as store:
        store.record_matches([make_match(1), make_match(2)])
        with pytest.raises(DuplicateMatchError, match="match id 2"):
            store.record_matches([make_match(3), make_match(2), make_match(4)],
                                 ratings=[RatingRecord(3, "a", 26.0, 8.0)])
        with pytest.raises(DuplicateMatchError, match="match id 5"):
            store.record_matches([make_match(5), make_match(5)])
        assert store.count_matches() == 2 and store.last_seq() == 2
        assert [r.result.match_id for r in store.iter_matches()] == [1, 2]
        assert store.ratings_history() == []
        # the store is still usable and seqs stay dense
        assert store.record_matches([make_match(3)]) == [3]


def test_ledger_is_append_only(tmp_path):
    with Store.open(tmp_path) as store:
        store.record_matches([make_match(1)])
        for sql in ("UPDATE matches SET kind = 'training'", "DELETE FROM seat_results",
                    "UPDATE seat_results SET outcome = 0.5", "DELETE FROM matches"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                store._connection().execute(sql)
        assert list(store.iter_matches())[0].result == make_match(1)


def test_player_totals_are_the_ledgers_sums_and_older_ledgers_get_them(tmp_path):
    """`Store.player_games`: games and summed outcome per player (a policy on several seats of a
    team plays one game), kept in `player_totals` by record_matches and rebuilt for a ledger
    written before that table existed; recent means over the newest games by match id."""
    matches = [make_match(i) for i in range(5)]
    matches += [make_match(5, players=("team", "x", "team", "y"), returns=(1.0, 0.0, 1.0, 0.0), teams=(0, 1, 0, 1)),
                make_match(6, players=("a", "b"), returns=(0.0, 0.0))]
    with Store.open(tmp_path) as store:
        store.record_matches(matches[:4])
        store.record_matches(matches[4:])
        games = store.player_games(recent=3)
    expected = {}
    for m in matches:
        first = {}
        for seat in m.seats:
            first.setdefault(seat.player_id, seat)
        for pid, seat in first.items():
            n, score, rows = expected.get(pid, (0, 0.0, []))
            expected[pid] = (n + 1, score + seat.outcome, rows + [(m.match_id, seat.episode_return, m.length)])
    assert set(games) == set(expected) == {"a", "b", "team", "x", "y"}
    for pid, (n, score, rows) in expected.items():
        newest = sorted(rows)[-3:]
        assert (games[pid].games, games[pid].score) == (n, score), pid
        assert games[pid].recent_return == pytest.approx(sum(r for _, r, _ in newest) / len(newest))
        assert games[pid].recent_length == pytest.approx(sum(x for _, _, x in newest) / len(newest))
    assert games["team"].games == 1 and games["team"].score == 1.0

    # A ledger from before player_totals: read-only opens sum the ledger, a writer adds the table.
    with sqlite3.connect(tmp_path / "ledger.sqlite") as raw:
        raw.execute("DROP TABLE player_totals")
    with Store.open(tmp_path, mode="read") as store:
        assert store.player_games(recent=3) == games
    with Store.open(tmp_path) as store:
        store.record_matches([make_match(7)])
    with Store.open(tmp_path, mode="read") as store:
        after = store.player_games(recent=3)
    assert after["a"].games == games["a"].games + 1 and after["team"] == games["team"]


def test_players_meta_and_ratings_history(tmp_path):
    with Store.open(tmp_path) as store:
        snap = PlayerRecord("snap-1", "snapshot", created_at=12.5, role="main_agent", snapshot_path="snapshots/1",
                            snapshot_hash="abc", metadata={"step": 1000})
        store.add_player(snap)
        store.add_player(snap)  # identical: no-op
        store.add_player(PlayerRecord("random", "anchor", created_at=13.0))
        with pytest.raises(StoreError, match="already registered"):
            store.add_player(PlayerRecord("snap-1", "snapshot", created_at=99.0))
        assert store.player("snap-1") == snap and store.player("nobody") is None
        assert [p.player_id for p in store.players()] == ["snap-1", "random"]
        assert [p.player_id for p in store.players(kind="anchor")] == ["random"]

        store.set_meta("config", {"lr": 3e-4, "games": [1, 2]})
        store.set_meta("iteration", 7)
        store.set_meta("iteration", 8)
        assert store.get_meta("config") == {"lr": 3e-4, "games": [1, 2]}
        assert store.get_meta("iteration") == 8 and store.get_meta("missing", "x") == "x"

        store.record_matches([make_match(1)], ratings=[RatingRecord(1, "a", 27.5, 7.1),
                                                      RatingRecord(1, "b", 22.5, 7.1)])
        store.record_matches([make_match(2)], ratings=[RatingRecord(2, "a", 28.25, 6.5)])
        assert store.ratings_history("a") == [RatingRecord(1, "a", 27.5, 7.1), RatingRecord(2, "a", 28.25, 6.5)]
        assert store.latest_ratings() == {"a": RatingRecord(2, "a", 28.25, 6.5), "b": RatingRecord(1, "b", 22.5, 7.1)}
        with pytest.raises(sqlite3.IntegrityError):  # a rating must point at a recorded match
            store.record_matches([], ratings=[RatingRecord(99, "a", 1.0, 1.0)])
        assert store.count_matches() == 2


def test_second_writer_refused_until_first_closes(tmp_path):
    first = Store.open(tmp_path)
    with pytest.raises(StoreLockedError) as info:
        Store.open(tmp_path, mode="write")
    message = str(info.value)
    assert "\n" not in message and f"process {os.getpid()}" in message and "read-only" in message
    assert isinstance(info.value, UserError)
    first.close()
    with Store.open(tmp_path) as second:
        assert second.mode == "write"


def test_lock_released_when_holder_is_killed(tmp_path):
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: take the writer lock, report, wait to be killed
        try:
            os.close(ready_r)
            Store.open(tmp_path)
            os.write(ready_w, b"1")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        with pytest.raises(StoreLockedError, match=f"process {pid}"):
            Store.open(tmp_path)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)
    with Store.open(tmp_path) as store:  # the OS released the flock with the process
        store.record_matches([make_match(1)])
        assert store.count_matches() == 1


def test_read_only_open_while_writing(tmp_path):
    writer = Store.open(tmp_path)
    writer.record_matches([make_match(1)])
    reader = Store.open(tmp_path, mode="read")
    assert reader.count_matches() == 1
    writer.record_matches([make_match(2), make_match(3)])
    assert [r.result.match_id for r in reader.iter_matches()] == [1, 2, 3]
    with pytest.raises(StoreError, match="read-only"):
        reader.record_matches([make_match(4)])
    with pytest.raises(StoreError, match="read-only"):
        reader.set_meta("k", 1)
    second_reader = Store.open(tmp_path, mode="read")  # any number of readers
    assert second_reader.last_seq() == 3
    writer.close()  # a reader is attached: the file stays in WAL mode, readers keep working
    assert reader.count_matches() == 3
    reader.close()
    second_reader.close()


def test_clean_close_leaves_no_side_files_for_readers(tmp_path):
    with Store.open(tmp_path) as store:
        store.record_matches([make_match(1)])
    before = sorted(os.listdir(tmp_path))
    assert before == ["ledger.sqlite", "writer.lock"]
    with Store.open(tmp_path, mode="read") as reader:
        assert reader.count_matches() == 1
    assert sorted(os.listdir(tmp_path)) == before


def test_read_mode_never_creates_anything(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(missing, mode="read")
    assert not missing.exists()
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(StoreError, match="no ledger"):
        Store.open(empty_dir, mode="read")
    assert os.listdir(empty_dir) == []


@pytest.mark.parametrize("mode", ["read", "write"])
def test_corrupt_file_refused_and_untouched(tmp_path, mode):
    path = tmp_path / "ledger.sqlite"
    garbage = b"this is not an SQLite database\x00\x01" * 64
    path.write_bytes(garbage)
    with pytest.raises(StoreError) as info:
        Store.open(tmp_path, mode=mode)
    assert "\n" not in str(info.value) and "not a readable SQLite database" in str(info.value)
    assert path.read_bytes() == garbage
    assert not (tmp_path / "ledger.sqlite-wal").exists()
    if mode == "write":  # the failed open released the writer lock
        with pytest.raises(StoreError, match="not a readable"):
            Store.open(tmp_path, mode="write")


def test_foreign_database_and_unknown_schema_version_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    connection = sqlite3.connect(foreign / "ledger.sqlite")
    connection.execute("CREATE TABLE stuff (x)")
    connection.commit()
    connection.close()
    before = (foreign / "ledger.sqlite").read_bytes()
    for mode in ("read", "write"):
        with pytest.raises(StoreError, match="not a Ludus ledger"):
            Store.open(foreign, mode=mode)
    assert (foreign / "ledger.sqlite").read_bytes() == before

    newer = tmp_path / "newer"
    Store.open(newer).close()
    connection = sqlite3.connect(newer / "ledger.sqlite")
    connection.execute("UPDATE schema_version SET version = 99")
    connection.commit()
    connection.close()
    for mode in ("read", "write"):
        with pytest.raises(StoreError, match="schema version"):
            Store.open(newer, mode=mode)


def test_atomic_write(tmp_path):
    target = tmp_path / "checkpoint.json"
    atomic_write_json(target, {"step": 1, "mu": 0.1 + 0.2})
    atomic_write_json(target, {"step": 2, "mu": 1 / 3})
    assert json.loads(target.read_text()) == {"step": 2, "mu": 1 / 3}
    atomic_write_bytes(tmp_path / "blob.bin", b"\x00\xff")
    assert (tmp_path / "blob.bin").read_bytes() == b"\x00\xff"
    with pytest.raises(ValueError):
        atomic_write_json(target, {"bad": float("nan")})
    assert json.loads(target.read_text())["step"] == 2  # a failed write leaves the old file
    assert sorted(os.listdir(tmp_path)) == ["blob.bin", "checkpoint.json"]
