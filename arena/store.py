"""The arena's state directory: its ledger, its entrants and their immutable submission copies.

Layout of an arena directory (default ``./arena_state``, mode 0700: agents never see it, it is
also in every sandbox's `SandboxConfig.hidden_paths`)::

    ledger.sqlite          ludus.league.records.ledger.Store: matches of kind 'arena', ratings history,
                           players (kind 'submission' or 'bot'), meta (the arena's game,
                           TrueSkill parameters, one entry per tournament)
    writer.lock            the Store's writer lock (a tournament holds it while it runs)
    submissions/<digest>/  a read-only copy of each submission, named by its content hash

The arena shares the league's ledger code rather than keeping its own tables: an entrant is a
`PlayerRecord` whose `snapshot_path` is its copy (relative to the directory) and whose
`snapshot_hash` is the submission's digest, so `verify_copy` can prove before every tournament
that the code about to run is the code that was validated at submit time.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ludus.arena.submission import Submission, SubmissionKind
from ludus.league.records.ledger import LEDGER_FILENAME, PlayerRecord, Store
from ludus.errors import UserError
from ludus.files import files_digest

ARENA_META_KEY = "arena"
"""Ledger meta key of the arena's identity: {"game": id, "created_at": t, "layout": 1}."""
TOURNAMENT_META_PREFIX = "arena_tournament:"
"""Ledger meta keys of finished tournaments: prefix + zero-padded tournament number."""
SUBMISSIONS_DIRNAME = "submissions"
LAYOUT_VERSION = 1
ENTRANT_KINDS = ("submission", "bot")
"""`PlayerRecord.kind` of arena entrants: a stranger's code run in a sandbox, or a built-in bot."""


HUMAN_KIND = "human"
"""`PlayerRecord.kind` of a person who played at the service's web seat (arena/human.py)."""
HUMAN_PREFIX = "human:"
"""A person's player id is ``human:ACCOUNT``: no entrant name has a ':', so it never meets an entrant's."""


class ArenaError(UserError):
    """The arena cannot do what was asked (no such arena, wrong game, name taken, ...)."""


@dataclass(frozen=True)
class ArenaInfo:
    """What an arena is for, fixed when it is created."""

    game: str
    """Registry id of the game every entrant plays."""
    created_at: float
    """Creation time (seconds since the epoch)."""

    def to_json(self) -> dict[str, Any]:
        return {"game": self.game, "created_at": self.created_at, "layout": LAYOUT_VERSION}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ArenaInfo":
        if data.get("layout") != LAYOUT_VERSION:
            raise ArenaError(f"arena layout {data.get('layout')!r} is not {LAYOUT_VERSION}; use the Ludus "
                             f"version that created it")
        return cls(str(data["game"]), float(data["created_at"]))


@dataclass(frozen=True)
class Entrant:
    """A registered arena player: a submission (copied into the arena) or a built-in bot."""

    player_id: str
    """Unique name; the ledger's player id."""
    kind: str
    """'submission' or 'bot' (`ENTRANT_KINDS`)."""
    submission_kind: SubmissionKind
    """Python folder, executable, snapshot or built-in."""
    version: str
    """Version string from the manifest (a snapshot: its id prefix; a bot: 'builtin')."""
    digest: str
    """Content hash of the submission (``builtin:<name>`` for bots)."""
    copy_path: str
    """Where its copy lives, relative to the arena directory ('' for bots); for a lone
    executable the file itself."""
    created_at: float
    """When it was submitted (seconds since the epoch)."""
    declared_game: str | None = None
    """The game its manifest names; None when it plays any game."""
    entry_point: str | None = None
    executable: str | None = None
    bot: str | None = None
    source: str = ""
    """The path (or bot name) it was submitted from, for people."""
    entered_by: str | None = None
    """Who entered it: 'operator' (`ludus arena submit`, bots) or 'account' (an upload to the
    service, by `account`); None in records from before Ludus kept it (`ludus.arena.accounts` infers it)."""
    account: str | None = None
    """The account that uploaded it (entered_by 'account'); None otherwise."""

    def submission(self, arena_dir: Path) -> Submission:
        """The `Submission` that plays this entrant (its path points at the arena's copy)."""
        path = arena_dir / self.copy_path if self.copy_path else None
        return Submission(self.submission_kind, self.player_id, self.version, self.declared_game, path,
                          self.digest, entry_point=self.entry_point, executable=self.executable, bot=self.bot)

    def to_record(self) -> PlayerRecord:
        metadata = {"type": self.submission_kind.value, "version": self.version, "game": self.declared_game,
                    "entry_point": self.entry_point, "executable": self.executable, "bot": self.bot,
                    "source": self.source}
        if self.entered_by is not None:
            # the owner and the normalised name live in the entry's own row, so the one INSERT that
            # enters it also claims its name: a refused or failed entry claims nothing
            metadata.update(entered_by=self.entered_by, account=self.account, name_key=name_key(self.player_id))
        return PlayerRecord(player_id=self.player_id, kind=self.kind, created_at=self.created_at,
                            snapshot_path=self.copy_path, snapshot_hash=self.digest, metadata=metadata)

    @classmethod
    def from_record(cls, record: PlayerRecord) -> "Entrant":
        meta = record.metadata
        return cls(record.player_id, record.kind, SubmissionKind(meta["type"]), meta["version"],
                   record.snapshot_hash, record.snapshot_path, record.created_at, meta.get("game"),
                   meta.get("entry_point"), meta.get("executable"), meta.get("bot"), meta.get("source", ""),
                   meta.get("entered_by"), meta.get("account"))


def base_name(player_id: str) -> str:
    """An entrant's name without its version: ``bob@3`` -> ``bob`` (``RUN/main@12`` -> ``RUN/main``)."""
    return player_id.split("@", 1)[0]


def name_key(player_id: str) -> str:
    """The key names are compared by: the base name, case-folded, so ``BOBBOT`` and ``bobbot`` are
    one name (entrant names are ASCII letters, digits and ``._-/``, for which casefold is lower)."""
    return base_name(player_id).casefold()


def ledger_exists(arena_dir: Path) -> bool:
    return (arena_dir / LEDGER_FILENAME).is_file()


def read_info(store: Store) -> ArenaInfo | None:
    data = store.get_meta(ARENA_META_KEY)
    return None if data is None else ArenaInfo.from_json(data)


def read_entrants(store: Store) -> list[Entrant]:
    """Entrants in submission order."""
    return [Entrant.from_record(r) for r in store.players() if r.kind in ENTRANT_KINDS]


@dataclass(frozen=True)
class HumanPlayer:
    """A person who played at the service's web seat: rated on the leaderboard like an entrant,
    never scheduled (only they choose when to play)."""

    player_id: str
    """``human:ACCOUNT``."""
    account: str
    created_at: float


def human_id(account: str) -> str:
    return HUMAN_PREFIX + account


def read_humans(store: Store) -> list[HumanPlayer]:
    """The people who played at the web seat, in order of their first game."""
    return [HumanPlayer(r.player_id, str(r.metadata.get("account", r.player_id[len(HUMAN_PREFIX):])), r.created_at)
            for r in store.players(HUMAN_KIND)]


def ensure_human(store: Store, account: str) -> HumanPlayer:
    """The person of `account` as a player of the arena (store opened for writing), registered on
    their first game."""
    player_id = human_id(account)
    record = store.player(player_id)
    if record is None:
        record = PlayerRecord(player_id=player_id, kind=HUMAN_KIND, created_at=time.time(),
                              metadata={"account": account})
        store.add_player(record)
    elif record.kind != HUMAN_KIND:
        raise ArenaError(f"the player id {player_id!r} is taken by a {record.kind}; rename the account")
    return HumanPlayer(player_id, account, record.created_at)


def tournament_key(number: int) -> str:
    return f"{TOURNAMENT_META_PREFIX}{number:06d}"


def count_tournaments(store: Store) -> int:
    """Number of finished tournaments (their meta entries are numbered 1, 2, ...)."""
    number = 0
    while store.get_meta(tournament_key(number + 1)) is not None:
        number += 1
    return number


# ------------------------------------------------------------------------------ submission copies


def submission_digest_of_copy(kind: SubmissionKind, copy: Path, max_bytes: int) -> str:
    """Recompute the digest `validate_submission` gave, over the arena's copy.

    Same definition as ludus.arena.submission (`ludus.files.files_digest` over the sorted files; a lone
    executable hashes its one file; a snapshot is its snapshot id)."""
    from ludus.arena.submission import _scan_files

    if kind == SubmissionKind.SNAPSHOT:
        from ludus.agents.snapshot import SnapshotError, verify_snapshot

        try:
            return verify_snapshot(copy).snapshot_id
        except SnapshotError as exc:
            raise ArenaError(f"the arena's copy {copy} is damaged: {exc}") from None
    if copy.is_file():
        return files_digest([(copy.name, copy)])
    return files_digest(_scan_files(copy, max_bytes))


def verify_copy(entrant: Entrant, arena_dir: Path, max_bytes: int) -> None:
    """Refuse to run an entrant whose stored copy no longer hashes to its recorded digest."""
    if entrant.submission_kind == SubmissionKind.BUILTIN:
        return
    copy = arena_dir / entrant.copy_path
    if not os.path.lexists(copy):
        raise ArenaError(f"the copy of {entrant.player_id!r} is missing ({copy}); restore the arena directory "
                         f"from a backup")
    found = submission_digest_of_copy(entrant.submission_kind, copy, max_bytes)
    if found != entrant.digest:
        raise ArenaError(f"the copy of {entrant.player_id!r} in {copy} was modified (digest {found[:12]}, "
                         f"submitted {entrant.digest[:12]}); restore it or submit the agent again under a new name")


def make_read_only(root: Path) -> None:
    """Remove every write bit below `root` (directories last, so the walk can still list them)."""
    if root.is_file():
        os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) & ~0o222)
        return
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~0o222)
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) & ~0o222)


def make_writable(root: Path) -> None:
    """Give the owner write permission again (to remove a half-made copy)."""
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | 0o700)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | 0o600)
