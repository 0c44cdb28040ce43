"""`ludus arena serve`: the arena as an HTTP service people submit to (Starlette/FastAPI + uvicorn).

One process serves one arena directory:

* **writes** need an account's token (`ludus arena token add NAME`; arena/accounts.py) as
  ``Authorization: Bearer <token>``: ``POST /api/submissions?name=NAME`` uploads an archive (zip or
  tar of a Python folder or an executable with its ``agent.toml``, or of a league snapshot), capped
  in size and in uploads per hour per account, unpacked without trusting it (arena/uploads.py) and
  validated in the sandbox before it is entered as ``NAME@k`` (the k-th version);
  ``POST /api/entrants/ID/withdraw`` takes one of the account's entrants out;
  ``POST /api/play``, ``GET /api/play/ID`` and ``POST /api/play/ID/move`` seat the account's person
  against an entrant (arena/human.py; the page ``/play``), rated on the leaderboard as ``human:ACCOUNT``;
* **reads** are open: ``GET /api/leaderboard``, ``/api/entrants/ID``, ``/api/matches/ID`` and
  ``/api/matches/ID/episode`` (the match as episode JSON, ludus.league.records.replay.match_episode), and the same
  as pages: ``/`` (live leaderboard with 95% intervals and head-to-head counts), ``/entrants/ID``,
  ``/matches/ID`` (the replay player), ``/submit`` (the upload form);
* **the scheduler** (arena/scheduler.py) plays rating matches in the sandbox in a background
  thread until the service stops, placement games for new entrants first.

The leaderboard is rebuilt from the ledger after each recorded match, by the scheduler's thread,
and served from memory, so reads never wait for the ledger. Uploads and the scheduler share one
write lock; the ledger's own writer lock is held only for each write. The store stays SQLite (the
`ludus.league.records.ledger.Store` interface); a deployment across machines would put a PostgreSQL store
behind the same calls.
"""

from __future__ import annotations

import collections
import fcntl
import html
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from ludus.arena.accounts import (ACCOUNT, ACCOUNTS_KEY, OPERATOR, Account, NameTakenError, NotYoursError, authenticate,
                            check_name_free, dead, entrant_owners, withdraw, withdrawn)
from ludus.agents.human_seat import HumanSettings
from ludus.agents.play_web import add_play_routes
from ludus.arena.api import Arena, check_entrant_name
from ludus.arena.human import ArenaHumans
from ludus.arena.leaderboard import INTERVAL_Z, RankingCache, build_leaderboard
from ludus.arena.scheduler import Scheduler, SchedulerSettings
from ludus.arena.store import HUMAN_KIND, ArenaError, ledger_exists, make_writable, read_entrants, read_humans
from ludus.arena.submission import SubmissionError
from ludus.arena.uploads import UploadLimits, unpack_archive
from ludus.league.records.ledger import Store
from ludus.league.records.replay import MATCH_ID_LIMIT
from ludus.errors import UserError
from ludus.pages import PAGE_CSS, csp_hash
from ludus.play_page import PLAY_JS, PLAY_PAGE_CSS, play_page

log = logging.getLogger(__name__)
BOARD_REFRESH_S = 1.0
"""Shortest time between two rebuilds of the cached leaderboard while matches are being recorded."""
INCOMING_DIRNAME = "incoming"
"""Uploads being unpacked and checked, inside the arena directory (hidden from every sandbox)."""


@dataclass(frozen=True)
class ServiceConfig:
    """How `ludus arena serve` runs."""

    host: str = "127.0.0.1"
    """Interface to listen on (loopback by default; put a TLS proxy in front for the internet)."""
    port: int = 8000
    upload: UploadLimits = UploadLimits()
    """Size, file-count and inflation limits of one uploaded archive."""
    uploads_per_hour: int = 30
    """Uploads an account may make in any hour (refused or not: each costs a sandboxed check)."""
    scheduler: SchedulerSettings = SchedulerSettings()
    schedule: bool = True
    """Run the scheduler (False: serve the leaderboard and take uploads only)."""
    min_cell_games: int = 4
    """Head-to-head cells with fewer games are greyed out on the pages."""
    recent_matches: int = 50
    """Matches listed on the leaderboard."""
    auth_failures_burst: int = 10
    """Failed authentications a client address may make at once before it is answered 429."""
    auth_failures_per_minute: float = 6.0
    """How fast a client address earns failed authentications back (a token bucket)."""
    header_timeout_s: float = 10.0
    """A connection's request line and headers must arrive within this long (slowloris)."""
    body_timeout_s: float = 300.0
    """A request's whole body must arrive within this long after its headers (64 MiB at 220 KB/s)."""
    human: HumanSettings = HumanSettings()
    """The web seats (``/play``): a person's move timeout, games at once, longest text move."""


def _clean_incoming(incoming: Path) -> int:
    """Make `incoming/` and remove what a killed service left in it (a kill -9 skips the removal
    of an upload's directory), unless another live service on the same arena is using it. Returns
    the descriptor of a shared lock on ``incoming/.lock`` that says this service is live; each
    service holds one until it closes, and cleaning needs the lock alone."""
    incoming.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(incoming / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.warning("another service is serving this arena: its uploads in %s are left alone", incoming)
    else:
        for stale in incoming.glob("upload-*"):
            make_writable(stale)  # a sandbox check may have left read-only copies inside
            shutil.rmtree(stale, ignore_errors=True)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


class FailureBuckets:
    """Failed authentications per client address, as token buckets: `burst` at once, then `rate`
    per second. An address whose bucket is empty is answered 429 before its token is even looked
    at, so a guesser learns nothing from the extra tries; successful authentications take nothing."""

    MAX_CLIENTS = 10_000
    """Addresses remembered; past it, the full buckets (indistinguishable from new ones) go first."""

    def __init__(self, burst: int, rate: float):
        self.burst = float(burst)
        self.rate = rate
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at monotonic time)
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def wait(self, client: str) -> float | None:
        """None if `client` may try a token now, else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            tokens = self._tokens(client, now)
        return None if tokens >= 1 else (1 - tokens) / self.rate

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._buckets[client] = (max(0.0, self._tokens(client, now) - 1), now)
            if len(self._buckets) > self.MAX_CLIENTS:
                full = [c for c in self._buckets if self._tokens(c, now) >= self.burst]
                for c in full or list(self._buckets)[:len(self._buckets) - self.MAX_CLIENTS]:
                    del self._buckets[c]


@dataclass
class _Board:
    payload: bytes = b"{}"
    total_matches: int = -1
    built_at: float = 0.0


class ArenaService:
    """The arena behind the HTTP app: accounts, uploads, the scheduler and the cached leaderboard."""

    def __init__(self, arena: Arena, config: ServiceConfig = ServiceConfig()):
        self.arena = arena
        self.config = config
        self.write_lock = threading.Lock()
        self.stop_event = threading.Event()
        self.scheduler = Scheduler(arena, config.scheduler, self.write_lock, on_recorded=self._recorded)
        self.thread: threading.Thread | None = None
        self.board = _Board()
        self._board_lock = threading.Lock()
        # Bradley-Terry's bootstrap and stability search redone at most every 30 s, point fits at each rebuild
        self.ranking_cache = RankingCache()
        # One rebuild at a time, so the last to start is the last to land: otherwise a rebuild the
        # scheduler began before a withdrawal could finish after the withdrawal's own and put the
        # withdrawn entrant back on the board.
        self._rebuild_lock = threading.Lock()
        self._uploads: dict[str, collections.deque] = {}
        self._uploads_lock = threading.Lock()
        self.scheduler_error: str | None = None
        self.auth_failures = FailureBuckets(config.auth_failures_burst, config.auth_failures_per_minute / 60)
        self._incoming_lock = _clean_incoming(arena.directory / INCOMING_DIRNAME)
        self.humans = ArenaHumans(arena, config.human, self.write_lock, self.scheduler, self.refresh_board)
        self.refresh_board()

    # -- lifecycle

    def start(self) -> None:
        if self.config.schedule and self.thread is None:
            self.thread = threading.Thread(target=self._schedule, name="ludus-arena-scheduler", daemon=True)
            self.thread.start()

    def _schedule(self) -> None:
        try:
            self.scheduler.run(self.stop_event)
        except Exception as exc:  # the service keeps serving reads; the page and the log say why
            self.scheduler_error = f"{type(exc).__name__}: {exc}"
            log.exception("the arena scheduler stopped")
            self.refresh_board()

    def close(self) -> None:
        self.humans.games.close()  # games in progress end unrecorded; their opponents' processes are shut down
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self._incoming_lock >= 0:  # closing says to a restarted service that this one is gone
            os.close(self._incoming_lock)
            self._incoming_lock = -1

    # -- reads

    def _recorded(self, round_done: bool) -> None:
        """After each recorded match: rebuild the leaderboard at most every `BOARD_REFRESH_S`
        (rebuilding reads the whole ledger), and always when a round is done."""
        if round_done or time.time() - self.board.built_at >= BOARD_REFRESH_S:
            self.refresh_board()

    def refresh_board(self) -> None:
        """Rebuild the cached leaderboard JSON from the ledger (after each recorded match)."""
        with self._rebuild_lock:
            if not ledger_exists(self.arena.directory):
                data = {"game": self.arena.game, "rows": [], "head_to_head": {"players": [], "games": [], "score": []},
                        "recent": [], "total_matches": 0, "bradley_terry": None}
            else:
                with Store.open(self.arena.directory, mode="read") as store:
                    data = leaderboard_json(build_leaderboard(store, self.config.recent_matches, self.ranking_cache))
            data["scheduler"] = {"running": self.thread is not None and self.scheduler_error is None,
                                 "matches_recorded": self.scheduler.recorded, "error": self.scheduler_error}
            data["updated_at"] = time.time()
            payload = json.dumps(data, separators=(",", ":")).encode()
            with self._board_lock:
                self.board = _Board(payload, data["total_matches"], time.time())

    def leaderboard(self) -> dict[str, Any]:
        with self._board_lock:
            return json.loads(self.board.payload)

    # -- writes

    def account(self, authorization: str | None) -> Account | None:
        token = None
        if authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        if not ledger_exists(self.arena.directory):
            return None
        with Store.open(self.arena.directory, mode="read") as store:
            return authenticate(store.get_meta(ACCOUNTS_KEY, {}), token)

    def allow_upload(self, account: Account) -> float | None:
        """None if the account may upload now, else the seconds until it may."""
        now = time.monotonic()
        with self._uploads_lock:
            recent = self._uploads.setdefault(account.name, collections.deque())
            while recent and now - recent[0] > 3600:
                recent.popleft()
            if len(recent) >= self.config.uploads_per_hour:
                return 3600 - (now - recent[0])
            recent.append(now)
        return None

    def incoming(self) -> Path:
        """A fresh private directory for one upload."""
        return Path(tempfile.mkdtemp(prefix="upload-", dir=self.arena.directory / INCOMING_DIRNAME))

    def accept(self, account: Account, name: str, archive: Path) -> dict[str, Any]:
        """Unpack, validate in the sandbox and enter an uploaded archive as NAME@k."""
        if "@" in name or "/" in name:
            raise ArenaError(f"name {name!r} may not contain '@' or '/': versions are numbered by the arena")
        check_entrant_name(name)
        with Store.open(self.arena.directory, mode="read") as store:
            check_name_free(store, name, account.name)  # early, to spare the sandboxed check; `enter` decides
        folder = unpack_archive(archive, archive.parent / "unpacked", self.config.upload)
        submission = self.arena.validate(folder, self.arena.game)
        if submission.game is not None and self.arena.game is not None and submission.game != self.arena.game:
            raise ArenaError(f"the upload plays {submission.game!r}, this arena plays {self.arena.game!r}")
        with self.write_lock:
            # the name is checked, numbered and claimed by the one write that enters the upload
            entrant = self.arena.enter(submission, name, account.name, new_version=True)
            twins = self.arena.same_content(entrant)
        version = int(entrant.player_id.rsplit("@", 1)[1])
        result = {"player_id": entrant.player_id, "version": version, "kind": entrant.submission_kind.value,
                  "digest": entrant.digest, "account": account.name}
        if twins:
            result["warning"] = f"the same content as {', '.join(twins)}"
        return result

    def withdraw(self, account: Account, player_id: str) -> dict[str, Any]:
        with self.write_lock, Store.open(self.arena.directory, mode="write") as store:
            withdraw(store, player_id, account.name)  # NotYoursError unless the account entered it
        self.refresh_board()
        return {"player_id": player_id, "withdrawn": True}

    # -- single records

    def entrant(self, player_id: str) -> dict[str, Any]:
        with Store.open(self.arena.directory, mode="read") as store:
            entrant = next((e for e in read_entrants(store) if e.player_id == player_id), None)
            if entrant is None:
                person = next((h for h in read_humans(store) if h.player_id == player_id), None)
                if person is None:
                    raise ArenaError(f"no entrant {player_id!r}")
                return self._person(store, person)
            history = [{"seq": r.seq, "mu": r.mu, "sigma": r.sigma} for r in store.ratings_history(player_id)]
            matches = [m.result for m in store.iter_matches(kinds=("arena",), player_id=player_id)][-50:]
            gone = withdrawn(store)
            owner = entrant_owners(store)[player_id]
            death = dead(store).get(player_id)
        return {"player_id": player_id, "kind": entrant.kind, "submission_kind": entrant.submission_kind.value,
                "version": entrant.version, "digest": entrant.digest, "created_at": entrant.created_at,
                "account": owner, "entered_by": OPERATOR if owner is None else ACCOUNT,
                "withdrawn": player_id in gone, "dead": None if death is None else death.why, "history": history,
                "matches": [match_json(m) for m in reversed(matches)], "bradley_terry": self.bt_row(player_id)}

    def _person(self, store: Store, person) -> dict[str, Any]:
        """A person who played at the web seat, in the shape of an entrant's record."""
        history = [{"seq": r.seq, "mu": r.mu, "sigma": r.sigma} for r in store.ratings_history(person.player_id)]
        matches = [m.result for m in store.iter_matches(kinds=("arena",), player_id=person.player_id)][-50:]
        return {"player_id": person.player_id, "kind": HUMAN_KIND, "submission_kind": HUMAN_KIND, "version": "-",
                "digest": "", "created_at": person.created_at, "account": person.account, "entered_by": ACCOUNT,
                "withdrawn": False, "dead": None, "history": history,
                "matches": [match_json(m) for m in reversed(matches)], "bradley_terry": self.bt_row(person.player_id)}

    def bt_row(self, player_id: str) -> dict[str, Any] | None:
        """The entrant's Bradley-Terry row of the cached board, with the board's stability line."""
        board = self.leaderboard()
        row = next((r for r in board["rows"] if r["player_id"] == player_id), None)
        if row is None or row.get("bt") is None:
            return None
        return {**row["bt"], "stability": (board.get("bradley_terry") or {}).get("stability_text")}

    def num_seats(self) -> int:
        from ludus.games import registry

        game = self.arena.game
        return 2 if game is None else registry.spec(game).num_players

    def match(self, match_id: int):
        try:
            return self.arena.match(match_id)
        except ArenaError:  # its message names the arena's directory, which is not the public's to see
            raise NotFound(f"no match {match_id} in this arena") from None


class NotFound(UserError):
    """A record the service does not have (answered 404)."""


def parse_match_id(text: str) -> int:
    """A match id from a URL, or `NotFound` for text no ledger's id can be (negative, not a
    number, 2^63 or more: sqlite3 raises OverflowError for an integer past 64 bits)."""
    if text.isascii() and text.isdigit() and len(text) <= 19 and int(text) < MATCH_ID_LIMIT:
        return int(text)
    raise NotFound(f"no match {text[:40]!r}: match ids are whole numbers from 0 to 2^63-1")


def scrub_paths(message: str, work: Path) -> str:
    """An upload's refusal without the server's filesystem: the upload's own files by their names
    inside the archive, any other path below a server directory (the arena, the sandbox's
    temporary copies, the Python installation, home) by its last component."""
    unpacked = work / "unpacked"
    for base in sorted({str(unpacked), str(unpacked.absolute()), str(unpacked.resolve())}, key=len, reverse=True):
        message = message.replace(base + "/", "").replace(base, "the upload")
    roots = {str(Path(r).resolve()) for r in (work.parent.parent, tempfile.gettempdir(), sys.prefix,
                                              sys.base_prefix, Path(__file__).resolve().parents[1], Path.home())}
    roots |= {str(work.parent.parent.absolute())}
    pattern = "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True) if len(r) > 1)
    return re.sub(f"(?:{pattern})(?![\\w.-])(?:/[^\\s'\":]*)?", lambda m: Path(m.group()).name, message)


# ----------------------------------------------------------------------------------------- JSON


def match_json(match) -> dict[str, Any]:
    return {"id": match.match_id, "players": [s.player_id for s in match.seats],
            "teams": [s.team for s in match.seats], "returns": [s.episode_return for s in match.seats],
            "outcomes": [s.outcome for s in match.seats], "statuses": [s.status for s in match.seats],
            "errors": [s.error for s in match.seats], "moves": match.length, "seed": match.seed,
            "started_at": match.started_at, "duration_s": match.duration_s,
            "tournament": match.metadata.get("tournament")}


def leaderboard_json(board) -> dict[str, Any]:
    """The board as the service serves it: per row TrueSkill and (``bt``) Bradley-Terry with its
    intervals, forfeit rates and rating without forfeited matches; ``bradley_terry`` says how
    the latter was computed, with the rank-stability figure, warnings and per-game boards."""
    h2h = board.head_to_head
    n = len(h2h.players)
    views = board.ranking
    bt = {r["player"]: r for r in views.rows()} if views is not None else {}
    return {
        "game": board.game, "total_matches": board.total_matches,
        "rows": [{"rank": r.rank, "player_id": r.player_id, "kind": r.kind, "submission_kind": r.submission_kind,
                  "mu": r.mu, "sigma": r.sigma, "low": r.mu - INTERVAL_Z * r.sigma, "high": r.mu + INTERVAL_Z * r.sigma,
                  "conservative": r.conservative, "games": r.games, "wins": r.wins, "draws": r.draws,
                  "losses": r.losses, "faults": dict(r.faults), "bt": bt.get(r.player_id)} for r in board.rows],
        "bradley_terry": None if views is None else {
            "ties": "half a win", "scale": "elo-like, mean 1000", "rounds": views.rounds, "seed": views.seed,
            "level": 0.95, "games": views.board.games, "slow_views_games": views.slow_games,
            "combined_equal_weight_per_game": views.multi_game,
            "stability_text": views.stability_text() + (f" (as of {views.slow_games} games)" if views.stale else ""),
            "stability": views.to_json()["stability"], "forfeit_warnings": [w.text for w in views.warnings],
            "games_by_kind": [{"game": b.game, "games": b.games} for b in views.per_game]},
        "head_to_head": {"players": list(h2h.players),
                         "games": [[h2h.games(i, j) for j in range(n)] for i in range(n)],
                         "score": [[h2h.score(i, j) for j in range(n)] for i in range(n)]},
        "recent": [match_json(m) for m in board.recent_matches],
    }


# ---------------------------------------------------------------------------------------- pages


_CSS = PAGE_CSS + """
nav a { margin-right: 14px; } svg.bar { display: block; width: 100%; min-width: 160px; height: 14px; }
.bar .track { fill: #eee; } .bar .interval { fill: #7aa6d8; } .bar .mu { fill: #1f4e8c; }
td.few { color: #bbb; background: #fafafa; }
.fault { color: #b00; } td.bt { font-weight: 600; } p.stability { font-weight: 600; margin: 8px 0 2px; }
#result { white-space: pre-wrap; font-family: monospace; margin-top: 10px; }
form label { display: block; margin: 8px 0 2px; } input[type=text], input[type=password] { width: 360px; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _link(path: str, *parts: object) -> str:
    return path + "/".join(urllib.parse.quote(str(p), safe="") for p in parts)


def _page(title: str, body: str, script: str = "") -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"{_NAV}"
            f"<h1>{_e(title)}</h1>{body}" + (f"<script>{script}</script>" if script else "") + "</body></html>\n")


_NAV = ('<nav><a href="/">leaderboard</a><a href="/play">play</a><a href="/submit">submit</a>'
        '<a href="/api/leaderboard">JSON</a></nav>')


# Live: re-read the page when the ledger has new matches (a poll of the cached JSON, every 3 s).
_LIVE_JS = """
(function () {
  var seen = Number(document.body.dataset.matches || -1);
  setInterval(function () {
    fetch("/api/leaderboard", {cache: "no-store"}).then(function (r) { return r.json(); }).then(function (d) {
      if (d.total_matches !== seen) { location.reload(); }
    }).catch(function () {});
  }, 3000);
})();
"""


def _bt_cells(bt: dict | None) -> str:
    """BT rating, interval, rank interval and forfeit rate cells of a leaderboard row."""
    if bt is None:
        return "<td>-</td>" * 4
    span = "-" if bt["low"] is None else f'[{bt["low"]:.0f}, {bt["high"]:.0f}]'
    ranks = "-" if bt["rank_low"] is None else f'{bt["rank_low"]}-{bt["rank_high"]}'
    rate = "-" if bt["forfeit_rate"] is None else f'{bt["forfeit_rate"]:.1%}'
    return f'<td class="bt">{bt["rating"]:.0f}</td><td>{span}</td><td>{ranks}</td><td class="forfeit-rate">{rate}</td>'


def _bt_notes(info: dict | None, rows: list[dict]) -> str:
    """Under the table: the stability figure, what BT is, rates by kind and ratings without
    forfeited matches for entrants that forfeited, and the forfeit-dependence warnings."""
    if info is None:
        return '<p class="meta" id="bt-empty">Bradley-Terry: no games between two entrants yet.</p>'
    out = [f'<p class="stability" id="stability">{_e(info["stability_text"])}</p>',
           f'<p class="meta" id="bt-note">BT: Bradley-Terry over {info["games"]} games, ties as half wins, Elo-like '
           f'scale (mean 1000); 95% intervals of rating and rank from {info["rounds"]} bootstrap rounds'
           + (f' as of {info["slow_views_games"]} games (recomputed at most every 30 s)'
              if info["slow_views_games"] != info["games"] else "")
           + "; forfeit: share of its matches lost by its own fault.</p>"]
    faulty = [r for r in rows if r.get("bt") and r["bt"]["forfeits"]]
    if faulty:
        def clean(bt: dict) -> str:
            return "-" if bt["rating_without_forfeits"] is None else (
                f'{bt["rating_without_forfeits"]:.0f} (#{bt["rank_without_forfeits"]})')

        body = "".join(
            f'<tr><td class="name">{_e(r["player_id"])}</td><td>{r["bt"]["error_rate"]:.1%}</td>'
            f'<td>{r["bt"]["timeout_rate"]:.1%}</td><td>{r["bt"]["invalid_rate"]:.1%}</td>'
            f'<td>{r["bt"]["rating"]:.0f} (#{r["bt"]["place"]})</td><td>{clean(r["bt"])}</td></tr>' for r in faulty)
        out.append('<table id="forfeits"><tr><th class="name">entrant</th><th>error</th><th>timeout</th>'
                   "<th>invalid</th><th>BT (rank)</th><th>BT without forfeited matches (rank)</th></tr>"
                   f"{body}</table>")
    out += [f'<p class="fault warning">warning: {_e(text)}</p>' for text in info["forfeit_warnings"]]
    return "".join(out)


def leaderboard_page(data: dict[str, Any], min_cell_games: int) -> str:
    rows = data["rows"]
    lo = min((r["low"] for r in rows), default=0.0)
    hi = max((r["high"] for r in rows), default=1.0)
    span = max(hi - lo, 1e-9)

    def bar(r: dict) -> str:
        # SVG geometry, not style="..." attributes: the Content-Security-Policy refuses inline styles
        left, width = 100 * (r["low"] - lo) / span, 100 * (r["high"] - r["low"]) / span
        return (f'<svg class="bar" viewBox="0 0 100 14" preserveAspectRatio="none"><rect class="track" y="2" '
                f'width="100" height="10"/><rect class="interval" x="{left:.1f}" y="2" width="{width:.1f}" '
                f'height="10"/><rect class="mu" x="{100 * (r["mu"] - lo) / span - 0.6:.1f}" width="1.2" '
                f'height="14"/></svg>')

    table = "".join(
        f'<tr class="entrant" data-player="{_e(r["player_id"])}"><td>{r["rank"]}</td>'
        f'<td class="name"><a href="{_e(_link("/entrants/", r["player_id"]))}">{_e(r["player_id"])}</a></td>'
        f'<td class="name">{_e(r["submission_kind"])}</td><td>{r["mu"]:.2f}</td>'
        f'<td>[{r["low"]:.1f}, {r["high"]:.1f}]</td><td>{bar(r)}</td><td>{r["conservative"]:.2f}</td>'
        f"{_bt_cells(r.get('bt'))}"
        f'<td class="games">{r["games"]}</td><td>{r["wins"]}/{r["draws"]}/{r["losses"]}</td>'
        f'<td class="name fault">{_e(", ".join(f"{n} {k}" for k, n in r["faults"].items()))}</td></tr>'
        for r in rows)
    board = (f'<table id="leaderboard"><tr><th>#</th><th class="name">entrant</th><th class="name">kind</th>'
             f"<th>mu</th><th>95% interval</th><th></th><th>mu-3&sigma;</th><th>BT</th><th>BT 95% interval</th>"
             f"<th>BT ranks</th><th>forfeit</th><th>games</th><th>W/D/L</th>"
             f'<th class="name">forfeits</th></tr>{table}</table>{_bt_notes(data.get("bradley_terry"), rows)}'
             if rows else '<p class="empty" id="leaderboard-empty">No entrants yet: <a href="/submit">submit one</a>.</p>')
    h2h = data["head_to_head"]
    cells = []
    for i, a in enumerate(h2h["players"]):
        row = []
        for j, _ in enumerate(h2h["players"]):
            n, score = h2h["games"][i][j], h2h["score"][i][j]
            if i == j:
                row.append("<td></td>")
            elif n == 0:
                row.append('<td class="few">-</td>')
            else:
                few = ' class="few"' if n < min_cell_games else ""
                row.append(f'<td{few} title="{n} games">{score:.2f} <small>({n})</small></td>')
        cells.append(f'<tr><th class="name">{_e(a)}</th>{"".join(row)}</tr>')
    head = "".join(f"<th>{k + 1}</th>" for k in range(len(h2h["players"])))
    matrix = (f'<table id="head-to-head"><tr><th class="name">row vs column (score, games)</th>{head}</tr>'
              f'{"".join(cells)}</table><p class="meta">Columns in rank order; cells with fewer than '
              f"{min_cell_games} games are grey.</p>" if h2h["players"] else "")
    recent = "".join(
        f'<tr><td><a href="/matches/{m["id"]}">{m["id"]}</a></td><td class="name">'
        + " vs ".join(f'{_e(p)} {ret:+g}{"" if st == "ok" else f" <span class=fault>{_e(st)}</span>"}'
                      for p, ret, st in zip(m["players"], m["returns"], m["statuses"]))
        + f'</td><td>{m["moves"]}</td></tr>' for m in data["recent"])
    matches = (f'<table id="matches"><tr><th>match</th><th class="name">seats</th><th>moves</th></tr>{recent}</table>'
               if recent else '<p class="empty">No matches yet.</p>')
    sched = data.get("scheduler", {})
    state = ("scheduler stopped: " + _e(sched["error"])) if sched.get("error") else (
        "scheduler running" if sched.get("running") else "scheduler off")
    body = (f'<p class="meta" id="summary">game <b>{_e(data["game"])}</b> &middot; {data["total_matches"]} matches '
            f"&middot; {state} &middot; ranked by mu - 3&sigma;</p>{board}<h2>Head to head</h2>{matrix}"
            f"<h2>Recent matches</h2>{matches}")
    return _page("Ludus arena", body, _LIVE_JS).replace("<body>", f'<body data-matches="{data["total_matches"]}">', 1)


def entrant_page(data: dict[str, Any]) -> str:
    history = data["history"]
    points = "".join(f"<tr><td>{h['seq']}</td><td>{h['mu']:.2f}</td><td>{h['sigma']:.2f}</td></tr>"
                     for h in history[-30:])
    matches = "".join(
        f'<tr><td><a href="/matches/{m["id"]}">{m["id"]}</a></td><td class="name">'
        f'{_e(" vs ".join(m["players"]))}</td><td>{_e(m["returns"])}</td><td class="name">{_e(m["statuses"])}</td></tr>'
        for m in data["matches"])
    owner = ("entered by the operator" if data["account"] is None else
             f"a person, account {_e(data['account'])}, who plays at the web seat" if data["kind"] == HUMAN_KIND
             else f"account {_e(data['account'])}")
    bt = data.get("bradley_terry")
    ranking = ('<p class="meta" id="bt">Bradley-Terry: no games against another entrant yet.</p>' if bt is None else
               f'<p id="bt">Bradley-Terry <b>{bt["rating"]:.0f}</b>'
               + ("" if bt["low"] is None else f' (95% interval {bt["low"]:.0f}&ndash;{bt["high"]:.0f}, rank '
                                                f'{bt["rank_low"]}&ndash;{bt["rank_high"]})')
               + f', place {bt["place"]}, {bt["games"]} games; forfeits {bt["forfeit_rate"]:.1%} (error '
               f'{bt["error_rate"]:.1%}, timeout {bt["timeout_rate"]:.1%}, invalid {bt["invalid_rate"]:.1%})'
               + ("" if bt["rating_without_forfeits"] is None else
                  f'; without forfeited matches {bt["rating_without_forfeits"]:.0f} (#{bt["rank_without_forfeits"]})')
               + "</p>" + (f'<p class="meta">{_e(bt["stability"])}</p>' if bt.get("stability") else ""))
    person = data["kind"] == HUMAN_KIND  # no version, no code: a person
    body = (f'<p class="meta">{_e(data["submission_kind"])} &middot; '
            + ("" if person else f'version {_e(data["version"])} &middot; ')
            + f'<span id="owner">{owner}</span>' + ("" if person else f' &middot; digest {_e(data["digest"][:16])}')
            + f'{" &middot; <b>withdrawn</b>" if data["withdrawn"] else ""}'
            f'{" &middot; <b>dead</b> (" + _e(data["dead"]) + ")" if data.get("dead") else ""}</p>{ranking}'
            f'<h2>Rating history (latest 30)</h2><table id="history"><tr><th>after ledger seq</th><th>mu</th>'
            f'<th>sigma</th></tr>{points}</table><h2>Matches (latest 50)</h2><table id="entrant-matches"><tr>'
            f'<th>match</th><th class="name">seats</th><th>returns</th><th class="name">statuses</th></tr>{matches}'
            "</table>")
    return _page(data["player_id"], body)


_SUBMIT_JS = """
document.getElementById("upload").addEventListener("submit", function (event) {
  event.preventDefault();
  var form = event.target, out = document.getElementById("result"), file = form.archive.files[0];
  if (!file) { out.textContent = "choose an archive first"; return; }
  out.textContent = "uploading and checking in the sandbox...";
  fetch("/api/submissions?name=" + encodeURIComponent(form.name.value), {
    method: "POST", body: file, headers: {"Authorization": "Bearer " + form.token.value,
                                          "Content-Type": "application/octet-stream"}
  }).then(function (r) { return r.json().then(function (d) { return [r.status, d]; }); }).then(function (rd) {
    var status = rd[0], d = rd[1];
    out.dataset.status = String(status);
    if (status === 201) {
      out.innerHTML = "";
      out.append("accepted: ");
      var a = document.createElement("a");
      a.href = "/entrants/" + encodeURIComponent(d.player_id); a.textContent = d.player_id; a.id = "entrant-link";
      out.append(a, " (" + d.kind + ", digest " + d.digest.slice(0, 12) + ")" + (d.warning ? "; " + d.warning : ""));
    } else {
      out.textContent = "refused (" + status + "): " + d.error;
    }
  }).catch(function (e) { out.textContent = "upload failed: " + e; });
});
"""


def submit_page(config: ServiceConfig) -> str:
    body = ('<form id="upload"><label>API token (from the arena operator: <code>ludus arena token add NAME</code>)'
            '</label><input type="password" name="token" autocomplete="off" required>'
            '<label>Entrant name (yours after your first upload; each upload is a new version NAME@k)</label>'
            '<input type="text" name="name" pattern="[A-Za-z0-9][A-Za-z0-9._\\-]{0,99}" required>'
            '<label>Archive: .zip, .tar or .tar.gz of a folder with agent.toml (Python or executable) or of a '
            f'league snapshot; at most {config.upload.max_upload_bytes >> 20} MiB, '
            f'{config.upload.max_files} files</label><input type="file" name="archive" required>'
            '<p><button type="submit">upload</button></p></form><div id="result"></div>'
            '<p class="meta">The arena checks the upload in its sandbox before it enters; docs/arena_protocol.md '
            "says how an agent talks to the arena.</p>")
    return _page("Submit an agent", body, _SUBMIT_JS)


# ------------------------------------------------------------------------------------- security


def security_headers() -> list[tuple[bytes, bytes]]:
    """What every response of the service carries. The pages keep their inline scripts and style
    sheets (they are self-contained, as the static pages `ludus arena leaderboard --html` writes),
    and the Content-Security-Policy allows exactly those by hash: any other script or style, an
    injected one included, is refused, as are frames of the pages on other sites."""
    from ludus.replay_page import PLAYER_JS, REPLAY_PAGE_CSS

    scripts = " ".join(csp_hash(js) for js in (_LIVE_JS, _SUBMIT_JS, PLAYER_JS, PLAY_JS))
    styles = " ".join(csp_hash(css) for css in (_CSS, REPLAY_PAGE_CSS, PLAY_PAGE_CSS))
    policy = (f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; img-src 'self'; "
              "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
    return [(b"content-security-policy", policy.encode()), (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]


class SecurityHeaders:
    """ASGI wrapper that adds `headers` to every response of `app`: pages, JSON, refusals, unknown
    paths, and the 500 of Starlette's outermost error handler, which a middleware inside the app
    would miss."""

    def __init__(self, app, headers: list[tuple[bytes, bytes]]):
        self.app = app
        self.headers = headers

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# ------------------------------------------------------------------------------------------ app


def make_app(service: ArenaService):
    """The Starlette/FastAPI application of a service (its scheduler starts with the app)."""
    from ludus.league.records.replay import match_episode
    from ludus.replay_page import replay_html

    @asynccontextmanager
    async def lifespan(app):
        service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.close)

    app = FastAPI(title="Ludus arena", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str, **headers: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError):
        missing = isinstance(exc, NotFound) or "no entrant" in str(exc) or "is not in the arena" in str(exc)
        return error(404 if missing else 400, str(exc).replace("\n", " "))

    def client(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    def authorize(request: Request) -> Account | JSONResponse:
        """The request's account, or the refusal to answer: 401 for a token that is not valid,
        429 once the client address has used up its failed tries (token bucket per address)."""
        address = client(request)
        wait = service.auth_failures.wait(address)
        if wait is not None:
            return error(429, f"too many requests with a token that is not valid from {address}; try again in "
                              f"{wait:.0f} s", **{"Retry-After": str(int(wait) + 1)})
        account = service.account(request.headers.get("authorization"))
        if account is None:
            service.auth_failures.failed(address)
            return error(401, "a valid API token is required (Authorization: Bearer <token>; the arena operator "
                              "makes one with `ludus arena token add NAME`)", **{"WWW-Authenticate": "Bearer"})
        return account

    @app.get("/api/leaderboard")
    async def api_leaderboard():
        return Response(service.board.payload, media_type="application/json")

    @app.get("/api/entrants/{player_id:path}")
    def api_entrant(player_id: str):
        return service.entrant(player_id)

    @app.get("/api/matches/{match_id}")
    def api_match(match_id: str):
        return match_json(service.match(parse_match_id(match_id)))

    @app.get("/api/matches/{match_id}/episode")
    def api_episode(match_id: str):
        return match_episode(service.match(parse_match_id(match_id)))

    @app.post("/api/submissions")
    async def api_submit(request: Request, name: str = ""):
        account = await run_in_threadpool(authorize, request)
        if isinstance(account, JSONResponse):
            return account
        if not name:
            return error(400, "name the entrant: POST /api/submissions?name=NAME")
        wait = service.allow_upload(account)
        if wait is not None:
            return error(429, f"account {account.name!r} has made {service.config.uploads_per_hour} uploads in the "
                              f"last hour; try again in {wait:.0f} s", **{"Retry-After": str(int(wait) + 1)})
        cap = service.config.upload.max_upload_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            return error(413, f"the upload is larger than {cap >> 20} MiB")
        work = await run_in_threadpool(service.incoming)
        try:
            archive = work / "upload"
            size = 0
            with open(archive, "wb") as out:
                try:
                    async for chunk in request.stream():
                        size += len(chunk)
                        if size > cap:
                            return error(413, f"the upload is larger than {cap >> 20} MiB")
                        out.write(chunk)
                except ClientDisconnect:  # gone, or cut off by the body timeout: nobody to answer
                    return Response(status_code=400)
            if size == 0:
                return error(400, "the upload is empty: send the archive as the request body")
            try:
                result = await run_in_threadpool(service.accept, account, name, archive)
            except NameTakenError as exc:  # someone else's name (the operator's or an account's)
                return error(409, str(exc).replace("\n", " "))
            except (SubmissionError, ArenaError) as exc:
                return error(400, scrub_paths(str(exc), work).replace("\n", " "))
            return JSONResponse(result, status_code=201)
        finally:
            await run_in_threadpool(_remove_tree, work)

    @app.post("/api/entrants/{player_id:path}/withdraw")
    def api_withdraw(player_id: str, request: Request):
        account = authorize(request)
        if isinstance(account, JSONResponse):
            return account
        try:
            return service.withdraw(account, player_id)
        except NotYoursError as exc:
            return error(403, str(exc).replace("\n", " "))

    @app.get("/", response_class=HTMLResponse)
    async def page_leaderboard():
        return leaderboard_page(service.leaderboard(), service.config.min_cell_games)

    @app.get("/entrants/{player_id:path}", response_class=HTMLResponse)
    def page_entrant(player_id: str):
        return entrant_page(service.entrant(player_id))

    @app.get("/matches/{match_id}", response_class=HTMLResponse)
    def page_match(match_id: str):
        match_id = parse_match_id(match_id)
        episode = match_episode(service.match(match_id))
        return replay_html(episode, f"Arena match {match_id}",
                           '<p class="meta"><a href="/">leaderboard</a> &middot; '
                           f'<a href="/api/matches/{match_id}/episode">episode JSON</a></p>')

    @app.get("/submit", response_class=HTMLResponse)
    async def page_submit():
        return submit_page(service.config)

    def identify(request: Request) -> str | JSONResponse:
        account = authorize(request)
        return account if isinstance(account, JSONResponse) else account.name

    add_play_routes(app, service.humans.games, identify, service.humans.start, service.num_seats)

    @app.get("/play", response_class=HTMLResponse)
    def page_play():
        return play_page(service.arena.game or "?", service.num_seats(), service.humans.opponents(), token=True,
                         title="Play an entrant", nav=_NAV, replays=True, intro=(
                             '<p class="meta">Sign in with your API token, choose an entrant and your seat, and '
                             "play: click a cell on a board, or type your move in a text game. The game is recorded "
                             "and rated on the leaderboard as <code>human:ACCOUNT</code>; without a move for "
                             f"{service.config.human.move_timeout_s:g} s you forfeit.</p>"))

    return app


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def guarded_protocol(header_timeout_s: float, body_timeout_s: float, headers: list[tuple[bytes, bytes]]):
    """uvicorn's h11 protocol with the read deadlines it lacks: its keep-alive timer runs only
    between requests and stops at the first byte, so a client that opens a connection and sends
    nothing, or a few header bytes now and then (slowloris), or a body that never ends, would hold
    the connection forever. Here each request's headers must be complete `header_timeout_s` after
    the connection opens or the request's first byte (else 408 and close), and its body
    `body_timeout_s` after the headers (else close: the app sees a disconnect). Once a request is
    in, the time is the app's (a sandboxed check takes seconds), not the client's. Header size is
    capped by h11 itself (16 KiB: a larger head is answered 400)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    body = json.dumps({"error": f"the request's headers did not arrive within {header_timeout_s:g} s"}).encode()
    timeout_response = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                        + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
                        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    class GuardedH11Protocol(H11Protocol):
        _deadline: float | None = None
        _timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._set_deadline(header_timeout_s)

        def data_received(self, data: bytes) -> None:
            waiting_for_headers = self.conn.their_state is h11.IDLE
            if waiting_for_headers and self._deadline is None:  # the first byte of the next request
                self._set_deadline(header_timeout_s)
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                if waiting_for_headers:
                    self._set_deadline(body_timeout_s)
            elif state is not h11.IDLE:  # the whole request is in (or the connection is done)
                self._deadline = None

        def connection_lost(self, exc) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def _set_deadline(self, seconds: float) -> None:
            self._deadline = self.loop.time() + seconds
            if self._timer is None:
                self._timer = self.loop.call_at(self._deadline, self._expire)

        def _expire(self) -> None:
            self._timer = None
            if self._deadline is None or self.transport.is_closing():
                return
            if self.loop.time() < self._deadline:  # moved on since the timer was set: wait for the new one
                self._timer = self.loop.call_at(self._deadline, self._expire)
                return
            if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
                self.transport.write(timeout_response)
            self.transport.close()

    return GuardedH11Protocol


def build_server(service: ArenaService):
    """The uvicorn server of a service (not started: `.run()` serves until SIGINT/SIGTERM)."""
    import uvicorn

    config = service.config
    headers = security_headers()
    return uvicorn.Server(uvicorn.Config(
        SecurityHeaders(make_app(service), headers), host=config.host, port=config.port, log_level="warning",
        access_log=False, http=guarded_protocol(config.header_timeout_s, config.body_timeout_s, headers)))


def serve(arena: Arena, config: ServiceConfig = ServiceConfig()) -> None:
    """Run the service until interrupted (SIGINT/SIGTERM stop the scheduler after its current round)."""
    service = ArenaService(arena, config)
    print(f"ludus arena: serving {arena.directory} ({arena.game or 'no game yet'}) on http://{config.host}:"
          f"{config.port}/ ; scheduler {'on' if config.schedule else 'off'}", flush=True)
    build_server(service).run()
