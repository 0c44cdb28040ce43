"""The run/arena state store: an append-only match ledger plus players, ratings history and meta.

One SQLite file, `<directory>/ledger.sqlite`, in WAL mode so that any number of read-only
openers (reports, the leaderboard page, `ludus league status`) see consistent snapshots while
the single writer appends. Everything derived (ratings, payoff tables) can be rebuilt by
replaying the ledger in `seq` order, so the ledger is the source of truth and checkpoints are
only a speed-up.

Layout (schema version 1):

* `matches`: one row per match. `seq` is the global insertion order of matches (1, 2, ...,
  assigned by the store); `match_id` is allocated by the caller and must be unique.
* `seat_results`: one row per (match, seat): team, player, return, rank-based outcome, status.
* `ledger` (view): `matches` joined with `seat_results`, one row per (match, seat) with every
  column, for ad-hoc SQL.
* `ratings_history`: (seq of the match that produced it, player_id, mu, sigma).
* `players`, `meta` (key -> JSON), `schema_version`.
* `player_totals`: each player's games and summed outcome, kept by `record_matches` in the same
  transaction as the matches (derived: what `ludus status` reads instead of the whole ledger). A
  ledger written before it existed gets it, filled from `seat_results`, when opened for writing.

`matches` and `seat_results` are append-only: SQLite triggers abort any UPDATE or DELETE.

Concurrency: `Store.open(dir, mode="write")` takes an exclusive `fcntl.flock` on
`<dir>/writer.lock`; the OS drops it when the process dies (even by SIGKILL), so a crashed
writer never leaves a stale lock. On a clean close the writer switches the file back to
rollback-journal mode (when no reader is attached) so that later read-only opens need no
`-wal`/`-shm` side files.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence

from ludus.errors import UserError

SCHEMA_VERSION = 1
LEDGER_FILENAME = "ledger.sqlite"
WRITER_LOCK_FILENAME = "writer.lock"

MATCH_KINDS = ("training", "rating", "evaluation", "arena")
"""What a match was played for: learner training, rating the pool, evaluating a checkpoint, the arena."""
SEAT_STATUSES = ("ok", "error", "timeout", "invalid")
"""How a seat's agent fared: played normally, crashed, ran out of time, or made an illegal move."""

_MAX_INT64 = 2**63 - 1
_BUSY_TIMEOUT_S = 5.0  # how long to wait for a lock held briefly by another connection
_PAGE_SIZE = 4096  # matches per query when iterating; bounds memory, not correctness


class StoreError(UserError):
    """The run directory's store cannot be opened or used as asked."""


class StoreLockedError(StoreError):
    """Another process holds the run directory's writer lock."""


class DuplicateMatchError(StoreError):
    """A match id in a batch is already in the ledger (or twice in the batch)."""


# ---------------------------------------------------------------------------------------------
# Records crossing the module boundary
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeatResult:
    """What happened to one seat of one match."""

    seat: int
    """Seat index in the game (0-based)."""
    team: int
    """Team id of the seat; seats with the same team id share an outcome."""
    player_id: str
    """Who played the seat (a snapshot, anchor bot, learner or arena submission id)."""
    episode_return: float
    """The seat's final return from the game (finite)."""
    outcome: float
    """Rank-based score of the seat's team against the other teams: 1 win, 0.5 draw, 0 loss;
    in games with more than two teams the fraction of other teams beaten, ties counting half
    (see `outcomes_from_returns`). The runner may override it, e.g. 0 for a seat that forfeits."""
    player_version: str = ""
    """Which version of the player: a learner's policy version, or a snapshot's id/hash."""
    status: str = "ok"
    """One of `SEAT_STATUSES`; anything but "ok" means the seat's agent was at fault."""
    error: str = ""
    """Error text for a seat whose status is not "ok"."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Small JSON-serialisable extras (e.g. mean inference latency)."""

    def __post_init__(self) -> None:
        if not isinstance(self.player_id, str) or not self.player_id:
            raise ValueError(f"seat {self.seat}: player_id must be a non-empty string, got {self.player_id!r}")
        if self.seat < 0:
            raise ValueError(f"seat index must be >= 0, got {self.seat}")
        if not math.isfinite(self.episode_return):
            raise ValueError(f"seat {self.seat}: episode_return must be finite, got {self.episode_return}")
        if not 0.0 <= self.outcome <= 1.0:
            raise ValueError(f"seat {self.seat}: outcome must be in [0, 1], got {self.outcome}")
        if self.status not in SEAT_STATUSES:
            raise ValueError(f"seat {self.seat}: status must be one of {SEAT_STATUSES}, got {self.status!r}")


@dataclass(frozen=True)
class MatchResult:
    """One finished match: match-level facts plus one `SeatResult` per seat, in seat order."""

    match_id: int
    """Caller-allocated unique id (a deterministic int in [0, 2**63))."""
    kind: str
    """One of `MATCH_KINDS`."""
    game_id: str
    """Registry id of the game played."""
    seed: int
    """Seed the game was reset with, in [0, 2**63)."""
    seats: tuple[SeatResult, ...]
    """Per-seat results, sorted by seat index."""
    length: int
    """Number of game steps played."""
    started_at: float
    """Wall-clock start time (seconds since the epoch)."""
    duration_s: float
    """Wall-clock duration in seconds."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Small JSON-serialisable extras about the match (e.g. the matchmaking method)."""
    moves: tuple[int, ...] | None = None
    """Every action applied, in order (simultaneous moves: seat order within a step); with the
    seed they re-simulate the match exactly. None when not recorded."""
    truncated: bool = False
    """The game was cut at its step limit instead of ending by its rules."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "seats", tuple(self.seats))
        if self.moves is not None:
            object.__setattr__(self, "moves", tuple(int(a) for a in self.moves))
        if "moves" in self.metadata or "truncated" in self.metadata:
            raise ValueError(f"match {self.match_id}: moves and truncated are fields, not metadata")
        if not 0 <= self.match_id <= _MAX_INT64:
            raise ValueError(f"match_id must be in [0, 2**63), got {self.match_id}")
        if not 0 <= self.seed <= _MAX_INT64:
            raise ValueError(f"match {self.match_id}: seed must be in [0, 2**63), got {self.seed}")
        if self.kind not in MATCH_KINDS:
            raise ValueError(f"match {self.match_id}: kind must be one of {MATCH_KINDS}, got {self.kind!r}")
        if not self.seats:
            raise ValueError(f"match {self.match_id}: needs at least one seat")
        seat_numbers = [s.seat for s in self.seats]
        if any(b <= a for a, b in zip(seat_numbers, seat_numbers[1:])):
            raise ValueError(f"match {self.match_id}: seats must be sorted and unique, got {seat_numbers}")
        team_outcome: dict[int, float] = {}
        for s in self.seats:
            if team_outcome.setdefault(s.team, s.outcome) != s.outcome:
                raise ValueError(f"match {self.match_id}: seats of team {s.team} have different outcomes")
        if self.length < 0 or self.duration_s < 0:
            raise ValueError(f"match {self.match_id}: length and duration_s must be >= 0")

    @property
    def player_ids(self) -> tuple[str, ...]:
        """Player of each seat, in seat order."""
        return tuple(s.player_id for s in self.seats)

    def stored_metadata(self) -> dict[str, Any]:
        """The ledger's metadata column: the extras plus the moves (one JSON object, as ever)."""
        stored = dict(self.metadata)
        if self.moves is not None:
            stored["moves"] = list(self.moves)
        if self.moves is not None or self.truncated:
            stored["truncated"] = self.truncated
        return stored

    @property
    def has_result(self) -> bool:
        """False when every seat failed (no seat has status "ok"): such a match says nothing about skill."""
        return any(s.status == "ok" for s in self.seats)

    def team_outcomes(self) -> dict[int, float]:
        """Outcome of each team, teams in order of first appearance."""
        outcomes: dict[int, float] = {}
        for s in self.seats:
            outcomes.setdefault(s.team, s.outcome)
        return outcomes


def outcomes_from_returns(returns: Sequence[float], teams: Sequence[int] | None = None) -> tuple[float, ...]:
    """Per-seat rank-based outcome from per-seat returns.

    A team's return is the mean of its seats' returns. A team scores one point for every other
    team with a lower return and half a point for every tie, divided by (number of teams - 1):
    two teams give 1 / 0.5 / 0; a four-player free-for-all gives the winner 1, the second 2/3,
    and so on. With a single team (a cooperative game) every seat gets 0.5.

    Args:
        returns: final return of each seat.
        teams: team id of each seat; None means every seat is its own team.
    """
    if teams is None:
        teams = range(len(returns))
    if len(teams) != len(returns):
        raise ValueError(f"got {len(returns)} returns but {len(teams)} team ids")
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for team, value in zip(teams, returns):
        sums[team] = sums.get(team, 0.0) + float(value)
        counts[team] = counts.get(team, 0) + 1
    team_return = {team: sums[team] / counts[team] for team in sums}
    if len(team_return) == 1:
        return tuple(0.5 for _ in returns)
    score: dict[int, float] = {}
    for team, value in team_return.items():
        beaten = sum(1.0 for other, v in team_return.items() if other != team and v < value)
        tied = sum(0.5 for other, v in team_return.items() if other != team and v == value)
        score[team] = (beaten + tied) / (len(team_return) - 1)
    return tuple(score[team] for team in teams)


@dataclass(frozen=True)
class RecordedMatch:
    """A match as read back from the ledger, with its position in the ledger."""

    seq: int
    """Global insertion order of the match (1-based, dense)."""
    result: MatchResult
    """The match as it was recorded."""


@dataclass(frozen=True)
class PlayerRecord:
    """A registered player (snapshot, anchor bot, learner, arena submission)."""

    player_id: str
    """Unique id used in seat results."""
    kind: str
    """What the player is, e.g. "snapshot", "anchor", "learner", "submission"."""
    created_at: float
    """Registration time (seconds since the epoch)."""
    role: str = ""
    """League role, e.g. "main_agent", "main_exploiter"; empty when not applicable."""
    snapshot_path: str = ""
    """Path of the frozen weights/submission, relative to the run directory when possible."""
    snapshot_hash: str = ""
    """Content hash of the snapshot, so a path cannot silently point at other weights."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Small JSON-serialisable extras (parent snapshot, training step, ...)."""

    def __post_init__(self) -> None:
        if not isinstance(self.player_id, str) or not self.player_id:
            raise ValueError(f"player_id must be a non-empty string, got {self.player_id!r}")
        if not self.kind:
            raise ValueError(f"player {self.player_id!r}: kind must be non-empty")


@dataclass(frozen=True)
class RatingRecord:
    """One entry of the ratings history: a player's rating right after match `seq` was rated."""

    seq: int
    """The `seq` of the match whose rating update produced this value."""
    player_id: str
    """Whose rating."""
    mu: float
    """TrueSkill mean."""
    sigma: float
    """TrueSkill standard deviation."""


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------

_PLAYER_TOTALS_TABLE = """
CREATE TABLE player_totals (
    player_id TEXT PRIMARY KEY,
    games INTEGER NOT NULL,
    score REAL NOT NULL
) WITHOUT ROWID;
"""

_SCHEMA = _PLAYER_TOTALS_TABLE + """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE players (
    player_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    role TEXT NOT NULL,
    snapshot_path TEXT NOT NULL,
    snapshot_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE matches (
    seq INTEGER PRIMARY KEY,
    match_id INTEGER NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    game_id TEXT NOT NULL,
    seed INTEGER NOT NULL,
    length INTEGER NOT NULL,
    started_at REAL NOT NULL,
    duration_s REAL NOT NULL,
    metadata TEXT NOT NULL
);
CREATE INDEX matches_by_kind ON matches (kind, seq);
CREATE TABLE seat_results (
    match_id INTEGER NOT NULL REFERENCES matches (match_id),
    seat INTEGER NOT NULL,
    team INTEGER NOT NULL,
    player_id TEXT NOT NULL,
    player_version TEXT NOT NULL,
    episode_return REAL NOT NULL,
    outcome REAL NOT NULL,
    status TEXT NOT NULL,
    error TEXT NOT NULL,
    metadata TEXT NOT NULL,
    PRIMARY KEY (match_id, seat)
) WITHOUT ROWID;
CREATE INDEX seat_results_by_player ON seat_results (player_id, match_id);
CREATE VIEW ledger AS
    SELECT m.match_id, m.seq, m.kind, m.game_id, m.seed, s.seat, s.team, s.player_id,
           s.player_version, s.episode_return, s.outcome, m.length, m.started_at, m.duration_s,
           s.status, s.error, m.metadata AS match_metadata, s.metadata AS seat_metadata
    FROM matches AS m JOIN seat_results AS s ON s.match_id = m.match_id;
CREATE TABLE ratings_history (
    seq INTEGER NOT NULL REFERENCES matches (seq),
    player_id TEXT NOT NULL,
    mu REAL NOT NULL,
    sigma REAL NOT NULL,
    PRIMARY KEY (seq, player_id)
) WITHOUT ROWID;
CREATE INDEX ratings_history_by_player ON ratings_history (player_id, seq);
CREATE TRIGGER matches_no_update BEFORE UPDATE ON matches
    BEGIN SELECT RAISE(ABORT, 'the match ledger is append-only'); END;
CREATE TRIGGER matches_no_delete BEFORE DELETE ON matches
    BEGIN SELECT RAISE(ABORT, 'the match ledger is append-only'); END;
CREATE TRIGGER seat_results_no_update BEFORE UPDATE ON seat_results
    BEGIN SELECT RAISE(ABORT, 'the match ledger is append-only'); END;
CREATE TRIGGER seat_results_no_delete BEFORE DELETE ON seat_results
    BEGIN SELECT RAISE(ABORT, 'the match ledger is append-only'); END;
"""

_MATCH_COLUMNS = "m.seq, m.match_id, m.kind, m.game_id, m.seed, m.length, m.started_at, m.duration_s, m.metadata"
_SEAT_COLUMNS = ("s.seat, s.team, s.player_id, s.episode_return, s.outcome, s.player_version, s.status, "
                 "s.error, s.metadata")


def _dump_json(value: Any) -> str:
    if isinstance(value, Mapping):
        if not value:
            return "{}"  # the common case, without the encoder's overhead
        value = dict(value)
    # sort_keys: the same metadata always gives the same bytes; allow_nan=False: strict JSON.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _load_json(text: str) -> Any:
    return {} if text == "{}" else json.loads(text)


# ---------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlayerGames:
    """A player's games in the ledger (`Store.player_games`)."""

    games: int
    score: float
    """Sum of its outcomes (win 1, draw 0.5, loss 0)."""
    recent_return: float
    """Mean episode return over its newest games (as many as asked for)."""
    recent_length: float
    """Mean length of those games."""
    recent_turns: int = 0
    """Text agents: turns it took in those games (seat metadata "turns"; 0 for other agents)."""
    recent_invalid: int = 0
    """Its invalid answers in those games (seat metadata "invalid": retried responses and moves
    the game refused)."""


class Store:
    """A run directory's ledger. Create with `Store.open`; use from one thread; close when done."""

    def __init__(self, directory: Path, connection: sqlite3.Connection, mode: str, lock_fd: int | None):
        """Internal; use `Store.open`."""
        self.directory = directory
        self.mode = mode
        self._conn: sqlite3.Connection | None = connection
        self._lock_fd = lock_fd
        self._counted = (0, 0)  # (seq, matches with seq <= it) as last counted: see count_matches_up_to

    # -- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | os.PathLike, mode: Literal["write", "read"] = "write") -> "Store":
        """Open (in write mode: create if needed) the store of a run directory.

        Write mode creates the directory and `ledger.sqlite` if missing and takes the exclusive
        writer lock (`StoreLockedError` if another process holds it). Read mode never creates
        anything: a missing directory or ledger raises `StoreError`. Both modes refuse a file that
        is not a Ludus ledger of a known schema version, without modifying it.
        """
        directory = Path(directory)
        if mode == "write":
            return cls._open_writer(directory)
        if mode == "read":
            return cls._open_reader(directory)
        raise ValueError(f"mode must be 'write' or 'read', got {mode!r}")

    @classmethod
    def _open_writer(cls, directory: Path) -> "Store":
        if directory.exists() and not directory.is_dir():
            raise StoreError(f"{directory} is a file, not a run directory; pass a directory path")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create run directory {directory} ({exc.strerror}); choose a writable path") from exc
        lock_fd = _acquire_writer_lock(directory)
        connection = None
        try:
            connection = sqlite3.connect(directory / LEDGER_FILENAME, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
            # Validate before anything writes to the file, so a foreign or corrupt file is untouched.
            tables = _validated_tables(connection, directory / LEDGER_FILENAME)
            connection.execute("PRAGMA journal_mode = WAL")
            # FULL: a committed batch survives power loss, so a checkpoint written after it never
            # refers to matches the ledger lost. One fsync per batch is cheap at batch granularity.
            connection.execute("PRAGMA synchronous = FULL")
            connection.execute("PRAGMA foreign_keys = ON")
            if not tables:
                # One transaction, so a crash mid-creation leaves an empty file, never half a schema.
                script = f"{_SCHEMA} INSERT INTO schema_version (version) VALUES ({SCHEMA_VERSION});"
            elif "player_totals" not in tables:
                script = _ADD_PLAYER_TOTALS  # a ledger from before the table: add it, filled
            else:
                script = ""
            if script:
                try:
                    connection.executescript(f"BEGIN IMMEDIATE; {script} COMMIT;")
                except BaseException:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                    raise
        except BaseException:
            if connection is not None:
                connection.close()
            _release_writer_lock(lock_fd)
            raise
        return cls(directory, connection, "write", lock_fd)

    @classmethod
    def _open_reader(cls, directory: Path) -> "Store":
        if not directory.is_dir():
            raise StoreError(f"run directory {directory} does not exist; check the path")
        path = directory / LEDGER_FILENAME
        if not path.is_file():
            raise StoreError(f"no ledger in {directory} (missing {LEDGER_FILENAME}); is this a Ludus run directory?")
        uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
        connection = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            tables = _validated_tables(connection, path)
            if not tables:
                raise StoreError(f"{path} has no Ludus tables yet (empty or still being created); retry later")
        except BaseException:
            connection.close()
            raise
        return cls(directory, connection, "read", None)

    @property
    def path(self) -> Path:
        """Path of the SQLite file."""
        return self.directory / LEDGER_FILENAME

    @property
    def closed(self) -> bool:
        return self._conn is None

    def close(self) -> None:
        """Close the database and release the writer lock. Idempotent."""
        if self._conn is None:
            return
        connection, self._conn = self._conn, None
        try:
            if connection.in_transaction:  # e.g. an exception escaped mid-write
                connection.execute("ROLLBACK")
            if self.mode == "write":
                # Leave the file in rollback-journal mode so later read-only opens need no -wal/-shm
                # files. Impossible while a reader is attached; then the file simply stays in WAL.
                connection.execute("PRAGMA busy_timeout = 0")
                try:
                    connection.execute("PRAGMA journal_mode = DELETE")
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) and "busy" not in str(exc):
                        raise
        finally:
            connection.close()
            if self._lock_fd is not None:
                _release_writer_lock(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the store of {self.directory} is closed; open it again")
        return self._conn

    def _writer(self) -> sqlite3.Connection:
        if self.mode != "write":
            raise StoreError(f"the store of {self.directory} was opened read-only; open it with mode='write'")
        return self._connection()

    def check(self) -> None:
        """Run SQLite's quick integrity check over the whole file; `StoreError` if it finds damage."""
        problems = [row[0] for row in self._connection().execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise StoreError(f"{self.path} is damaged ({problems[0]}); restore it from a backup")

    # -- meta ----------------------------------------------------------------------------------

    def set_meta(self, key: str, value: Any) -> None:
        """Set a meta entry to a JSON-serialisable value (replacing any previous value)."""
        self._writer().execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, _dump_json(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        """The value of a meta entry, or `default` when absent."""
        row = self._connection().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    # -- players -------------------------------------------------------------------------------

    def add_player(self, player: PlayerRecord) -> None:
        """Register a player. Re-adding an identical record is a no-op; a different one raises."""
        connection = self._writer()
        existing = self.player(player.player_id)
        if existing is not None:
            if existing != player:
                raise StoreError(f"player {player.player_id!r} is already registered with different fields; "
                                 f"choose a new player id")
            return
        connection.execute(
            "INSERT INTO players (player_id, kind, role, snapshot_path, snapshot_hash, created_at, metadata) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (player.player_id, player.kind, player.role, player.snapshot_path, player.snapshot_hash,
             float(player.created_at), _dump_json(player.metadata)))

    def player(self, player_id: str) -> PlayerRecord | None:
        """The registered player with this id, or None."""
        row = self._connection().execute(
            "SELECT player_id, kind, created_at, role, snapshot_path, snapshot_hash, metadata "
            "FROM players WHERE player_id = ?", (player_id,)).fetchone()
        return None if row is None else _player_from_row(row)

    def players(self, kind: str | None = None) -> list[PlayerRecord]:
        """All registered players (optionally of one kind), in registration order."""
        sql = ("SELECT player_id, kind, created_at, role, snapshot_path, snapshot_hash, metadata "
               "FROM players")
        args: tuple[Any, ...] = ()
        if kind is not None:
            sql += " WHERE kind = ?"
            args = (kind,)
        rows = self._connection().execute(sql + " ORDER BY rowid", args).fetchall()
        return [_player_from_row(row) for row in rows]

    # -- the match ledger ----------------------------------------------------------------------

    def last_seq(self) -> int:
        """The `seq` of the newest match; 0 for an empty ledger."""
        return self._connection().execute("SELECT COALESCE(MAX(seq), 0) FROM matches").fetchone()[0]

    def next_seq(self) -> int:
        """The `seq` the next recorded match will get (the writer is exclusive, so this is stable)."""
        return self.last_seq() + 1

    def comparable_rows(self) -> list[tuple]:
        """The whole ledger without wall-clock fields (seq, id, kind, seed, length, metadata, seats),
        then the ratings history: what two runs that played the same games have in common, so that
        equality of these lists is equality of the runs (resume, backends, reproducibility)."""
        rows: list[tuple] = []
        for rec in self.iter_matches():
            m = rec.result
            rows.append((rec.seq, m.match_id, m.kind, m.seed, m.length, json.dumps(m.stored_metadata(), sort_keys=True),
                         tuple((s.player_id, s.player_version, s.episode_return, s.outcome) for s in m.seats)))
        return rows + [(r.seq, r.player_id, r.mu, r.sigma) for r in self.ratings_history()]

    def count_matches_up_to(self, seq: int) -> int:
        """Rows with seq <= `seq`.

        The league checkpoints after every iteration, and a range COUNT reads every row: on a
        million-match ledger (Leduc poker, 10 minutes) that was 7% of the run. The ledger only
        appends (above its newest seq), so this store counts on from the last seq it counted; a
        fresh store (resume's `check_ledger`) counts every row, and so sees any row removed."""
        seq = int(seq)
        counted_seq, counted = self._counted
        if seq < counted_seq:
            return self._connection().execute("SELECT COUNT(*) FROM matches WHERE seq <= ?", (seq,)).fetchone()[0]
        # rows are appended only above the newest seq: what is counted up to it can never change
        seq_now = min(seq, self.last_seq())
        counted += self._connection().execute("SELECT COUNT(*) FROM matches WHERE seq > ? AND seq <= ?",
                                              (counted_seq, seq_now)).fetchone()[0]
        self._counted = (seq_now, counted)
        return counted

    def match_at_seq(self, seq: int) -> tuple[int, int] | None:
        """(match_id, seed) of the row at `seq`, or None."""
        row = self._connection().execute("SELECT match_id, seed FROM matches WHERE seq = ?", (int(seq),)).fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def max_match_id(self) -> int:
        """The largest match id in the ledger; -1 when empty (callers resume allocation from +1)."""
        return self._connection().execute("SELECT COALESCE(MAX(match_id), -1) FROM matches").fetchone()[0]

    def record_matches(self, results: Sequence[MatchResult], ratings: Sequence[RatingRecord] = ()) -> list[int]:
        """Append a batch of matches (and optionally the ratings they produced) in ONE transaction.

        The i-th match gets seq `next_seq() + i`. `ratings` entries must refer to seqs that exist
        after the batch (typically the batch's own, computed from `next_seq()`). On any error -
        in particular a duplicate match id (`DuplicateMatchError`) - nothing of the batch is kept.

        Returns:
            The seq of each match, in batch order.
        """
        connection = self._writer()
        if not results and not ratings:
            return []
        connection.execute("BEGIN IMMEDIATE")
        try:
            first_seq = connection.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM matches").fetchone()[0]
            seqs = list(range(first_seq, first_seq + len(results)))
            connection.executemany(
                "INSERT INTO matches (seq, match_id, kind, game_id, seed, length, started_at, duration_s, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(seq, r.match_id, r.kind, r.game_id, r.seed, r.length, float(r.started_at), float(r.duration_s),
                  _dump_json(r.stored_metadata())) for seq, r in zip(seqs, results)])
            connection.executemany(
                "INSERT INTO seat_results (match_id, seat, team, player_id, player_version, episode_return, "
                "outcome, status, error, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(r.match_id, s.seat, s.team, s.player_id, s.player_version, float(s.episode_return),
                  float(s.outcome), s.status, s.error, _dump_json(s.metadata))
                 for r in results for s in r.seats])
            connection.executemany(
                "INSERT INTO player_totals (player_id, games, score) VALUES (?, 1, ?) "
                "ON CONFLICT (player_id) DO UPDATE SET games = games + 1, score = score + excluded.score",
                [(player_id, outcome) for r in results for player_id, outcome in _first_seat_outcomes(r)])
            connection.executemany(
                "INSERT INTO ratings_history (seq, player_id, mu, sigma) VALUES (?, ?, ?, ?)",
                [(x.seq, x.player_id, float(x.mu), float(x.sigma)) for x in ratings])
            connection.execute("COMMIT")
        except sqlite3.IntegrityError as exc:
            connection.execute("ROLLBACK")
            duplicate = self._find_duplicate_match_id(results)
            if duplicate is not None:
                raise DuplicateMatchError(
                    f"match id {duplicate} is already in the ledger {self.path} (or twice in the batch); "
                    f"allocate match ids after max_match_id()={self.max_match_id()}") from exc
            raise
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        return seqs

    def _find_duplicate_match_id(self, results: Sequence[MatchResult]) -> int | None:
        seen: set[int] = set()
        for r in results:
            if r.match_id in seen:
                return r.match_id
            seen.add(r.match_id)
        ids = sorted(seen)
        for start in range(0, len(ids), 500):  # stay under SQLite's bound-parameter limit
            chunk = ids[start:start + 500]
            row = self._connection().execute(
                f"SELECT MIN(match_id) FROM matches WHERE match_id IN ({','.join('?' * len(chunk))})", chunk
            ).fetchone()
            if row[0] is not None:
                return row[0]
        return None

    def _filters(self, kinds: Sequence[str] | None, player_id: str | None) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if kinds is not None:
            kinds = list(kinds)
            unknown = [k for k in kinds if k not in MATCH_KINDS]
            if unknown:
                raise ValueError(f"unknown match kinds {unknown}; known kinds: {MATCH_KINDS}")
            clauses.append(f"m.kind IN ({','.join('?' * len(kinds))})")
            args.extend(kinds)
        if player_id is not None:
            clauses.append("m.match_id IN (SELECT match_id FROM seat_results WHERE player_id = ?)")
            args.append(player_id)
        return "".join(f" AND {c}" for c in clauses), args

    def iter_matches(self, kinds: Sequence[str] | None = None, player_id: str | None = None,
                     after_seq: int = 0) -> Iterator[RecordedMatch]:
        """Matches in ledger order (increasing seq), optionally only some kinds or one player's.

        Iterates the ledger as it was when called (up to the then-last seq), reading it in pages,
        so it is safe to call from a reader while the writer appends.

        Args:
            kinds: keep only these match kinds; None keeps all.
            player_id: keep only matches in which this player has a seat.
            after_seq: start after this seq (0 = from the beginning).
        """
        connection = self._connection()
        end_seq = self.last_seq()
        where, args = self._filters(kinds, player_id)
        sql = (f"SELECT {_MATCH_COLUMNS}, {_SEAT_COLUMNS} FROM matches AS m "
               f"JOIN seat_results AS s ON s.match_id = m.match_id "
               f"WHERE m.seq > ? AND m.seq <= ?{where} ORDER BY m.seq, s.seat")
        start = after_seq
        while start < end_seq:
            stop = min(start + _PAGE_SIZE, end_seq)
            rows = connection.execute(sql, [start, stop, *args]).fetchall()
            yield from _matches_from_rows(rows)
            start = stop

    def get_match(self, match_id: int) -> MatchResult | None:
        """One match by id, or None when it is not in the ledger."""
        rows = self._connection().execute(
            f"SELECT {_MATCH_COLUMNS}, {_SEAT_COLUMNS} FROM matches AS m "
            f"JOIN seat_results AS s ON s.match_id = m.match_id WHERE m.match_id = ? ORDER BY s.seat",
            (int(match_id),)).fetchall()
        found = list(_matches_from_rows(rows))
        return found[0].result if found else None

    def count_matches(self, kinds: Sequence[str] | None = None, player_id: str | None = None) -> int:
        """Number of matches, optionally only some kinds or one player's."""
        where, args = self._filters(kinds, player_id)
        return self._connection().execute(f"SELECT COUNT(*) FROM matches AS m WHERE 1{where}", args).fetchone()[0]

    def player_totals(self) -> dict[str, tuple[int, float]]:
        """Every player's (games, summed outcome) from `player_totals`. A player with several seats
        of one match (a team that shares one policy) plays one game, scored by its first seat."""
        connection = self._connection()
        if "player_totals" in _table_names(connection):
            rows = connection.execute("SELECT player_id, games, score FROM player_totals").fetchall()
        else:  # a ledger from before the table, opened read-only: sum it here
            rows = connection.execute(
                "SELECT player_id, COUNT(*), SUM(outcome) FROM (SELECT player_id, MIN(seat), outcome "
                "FROM seat_results GROUP BY player_id, match_id) GROUP BY player_id").fetchall()
        return {player_id: (int(games), float(score)) for player_id, games, score in rows}

    def player_games(self, recent: int) -> dict[str, PlayerGames]:
        """Every player's games (`player_totals`), and the mean return and length of its newest
        `recent` games (by match id, through the per-player index). Reads no match it does not report."""
        connection = self._connection()
        out = {}
        for player_id, (games, score) in self.player_totals().items():
            # min(seat) makes SQLite take the return from the player's first seat of each match
            ret, length, turns, invalid = connection.execute(
                "SELECT AVG(episode_return), AVG(length), SUM(turns), SUM(invalid) FROM (SELECT s.episode_return, "
                "MIN(s.seat), m.length, json_extract(s.metadata, '$.turns') AS turns, "
                "json_extract(s.metadata, '$.invalid') AS invalid "
                "FROM seat_results AS s JOIN matches AS m ON m.match_id = s.match_id WHERE s.player_id = ? "
                "GROUP BY s.match_id ORDER BY s.match_id DESC LIMIT ?)", (player_id, int(recent))).fetchone()
            out[player_id] = PlayerGames(games, score, float(ret), float(length), int(turns or 0), int(invalid or 0))
        return out

    def head_to_head(self, player_id: str, recent: int) -> dict[str, tuple[int, float]]:
        """Each opponent's (games, score) against `player_id` over `player_id`'s newest `recent`
        matches (by match id): score 1 when the opponent's team finished above it, .5 level, 0
        below; a player with several seats of one match counts once. Reads those matches only."""
        rows = self._connection().execute(
            "SELECT s.match_id, s.player_id, s.team, s.outcome, a.team, a.outcome FROM "
            "(SELECT match_id, MIN(seat), team, outcome FROM seat_results WHERE player_id = ? "
            " GROUP BY match_id ORDER BY match_id DESC LIMIT ?) AS a "
            "JOIN seat_results AS s ON s.match_id = a.match_id "
            "WHERE s.player_id != ? AND s.team != a.team ORDER BY s.match_id, s.seat",
            (player_id, int(recent), player_id)).fetchall()
        out: dict[str, tuple[int, float]] = {}
        seen = set()
        for match_id, opponent, _, outcome, _, own in rows:
            if (match_id, opponent) in seen:
                continue
            seen.add((match_id, opponent))
            games, score = out.get(opponent, (0, 0.0))
            out[opponent] = (games + 1, score + (1.0 if outcome > own else 0.5 if outcome == own else 0.0))
        return out

    # -- ratings history -----------------------------------------------------------------------

    def ratings_history(self, player_id: str | None = None) -> list[RatingRecord]:
        """Ratings history entries in seq order (optionally one player's)."""
        sql = "SELECT seq, player_id, mu, sigma FROM ratings_history"
        args: tuple[Any, ...] = ()
        if player_id is not None:
            sql += " WHERE player_id = ?"
            args = (player_id,)
        rows = self._connection().execute(sql + " ORDER BY seq, player_id", args).fetchall()
        return [RatingRecord(*row) for row in rows]

    def latest_ratings(self) -> dict[str, RatingRecord]:
        """Each rated player's newest ratings-history entry."""
        rows = self._connection().execute(
            "SELECT h.seq, h.player_id, h.mu, h.sigma FROM ratings_history AS h "
            "JOIN (SELECT player_id, MAX(seq) AS seq FROM ratings_history GROUP BY player_id) AS newest "
            "ON newest.player_id = h.player_id AND newest.seq = h.seq").fetchall()
        return {row[1]: RatingRecord(*row) for row in rows}


def _player_from_row(row: tuple[Any, ...]) -> PlayerRecord:
    player_id, kind, created_at, role, snapshot_path, snapshot_hash, metadata = row
    return PlayerRecord(player_id=player_id, kind=kind, created_at=created_at, role=role,
                        snapshot_path=snapshot_path, snapshot_hash=snapshot_hash, metadata=_load_json(metadata))


def _matches_from_rows(rows: list[tuple[Any, ...]]) -> Iterator[RecordedMatch]:
    """Group joined (match, seat) rows, ordered by seq then seat, into RecordedMatch objects."""
    i = 0
    while i < len(rows):
        seq, match_id, kind, game_id, seed, length, started_at, duration_s, metadata = rows[i][:9]
        seats = []
        while i < len(rows) and rows[i][0] == seq:
            seat, team, player_id, episode_return, outcome, version, status, error, seat_meta = rows[i][9:]
            seats.append(SeatResult(seat=seat, team=team, player_id=player_id, episode_return=episode_return,
                                    outcome=outcome, player_version=version, status=status, error=error,
                                    metadata=_load_json(seat_meta)))
            i += 1
        extras = _load_json(metadata)
        moves = extras.pop("moves", None)
        truncated = bool(extras.pop("truncated", False))
        yield RecordedMatch(seq=seq, result=MatchResult(
            match_id=match_id, kind=kind, game_id=game_id, seed=seed, seats=tuple(seats), length=length,
            started_at=started_at, duration_s=duration_s, metadata=extras, moves=moves, truncated=truncated))


def _first_seat_outcomes(result: MatchResult) -> list[tuple[str, float]]:
    """(player, outcome of its first seat) for each player of a match, in seat order."""
    seen: dict[str, float] = {}
    for seat in result.seats:
        seen.setdefault(seat.player_id, float(seat.outcome))
    return list(seen.items())


_ADD_PLAYER_TOTALS = _PLAYER_TOTALS_TABLE + """
INSERT INTO player_totals (player_id, games, score)
    SELECT player_id, COUNT(*), SUM(outcome) FROM (
        SELECT player_id, MIN(seat), outcome FROM seat_results GROUP BY player_id, match_id)
    GROUP BY player_id;
"""


def _table_names(connection: sqlite3.Connection) -> set[str]:
    return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _validated_tables(connection: sqlite3.Connection, path: Path) -> set[str]:
    """Names of the file's tables after checking it is an empty file or a Ludus ledger we can read."""
    try:
        tables = _table_names(connection)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is not a readable SQLite database ({exc}); move it aside or restore a backup")
    if not tables:
        return tables
    if "schema_version" not in tables:
        raise StoreError(f"{path} is an SQLite database but not a Ludus ledger; use another run directory")
    try:
        versions = [row[0] for row in connection.execute("SELECT version FROM schema_version")]
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is damaged ({exc}); move it aside or restore a backup")
    if versions != [SCHEMA_VERSION]:
        raise StoreError(f"{path} has ledger schema version {versions}, this Ludus reads version "
                         f"{SCHEMA_VERSION}; use the Ludus version that wrote it")
    return tables


def _acquire_writer_lock(directory: Path) -> int:
    """Take the exclusive writer lock of a run directory and write our pid into the lock file."""
    lock_path = directory / WRITER_LOCK_FILENAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f"process {holder}" if holder.isdigit() else "another process"
        raise StoreLockedError(f"run directory {directory} is already open for writing by {who}; "
                               f"stop it, or open the store read-only") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _release_writer_lock(fd: int) -> None:
    os.ftruncate(fd, 0)  # so nobody reports a pid that no longer holds the lock
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
