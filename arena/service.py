"""`ludus arena serve`: the arena as an HTTP service people submit to (Starlette/FastAPI + uvicorn).

One process serves one arena directory:

* **writes** need an account's token (`ludus arena token add NAME`; arena/accounts.py) as
  ``Authorization: Bearer <token>``: ``POST /api/submissions?name=NAME`` uploads an archive (zip or
  tar of a Python folder or an executable with its ``agent.toml``, or of a league snapshot), capped
  in size and in uploads per hour per account, unpacked without trusting it (arena/uploads.py) and
  validated in the sandbox before it is entered as ``NAME@k`` (the k-th version);
  ``POST /api/entrants/ID/withdraw`` takes one of the account's entrants out;
* **reads** are open: ``GET /api/leaderboard``, ``/api/entrants/ID``, ``/api/matches/ID`` and
  ``/api/matches/ID/episode`` (the match as episode JSON, league.replay.match_episode), and the same
  as pages: ``/`` (live leaderboard with 95% intervals and head-to-head counts), ``/entrants/ID``,
  ``/matches/ID`` (the replay player), ``/submit`` (the upload form);
* **the scheduler** (arena/scheduler.py) plays rating matches in the sandbox in a background
  thread until the service stops, placement games for new entrants first.

The leaderboard is rebuilt from the ledger after each recorded match, by the scheduler's thread,
and served from memory, so reads never wait for the ledger. Uploads and the scheduler share one
write lock; the ledger's own writer lock is held only for each write. The store stays SQLite (the
`league.ledger.Store` interface); a deployment across machines would put a PostgreSQL store
behind the same calls.
"""

from __future__ import annotations

import collections
import html
import json
import logging
import shutil
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

from arena.accounts import ACCOUNTS_KEY, Account, authenticate, claim_name, name_owner, withdraw, withdrawn
from arena.api import Arena, check_entrant_name
from arena.leaderboard import INTERVAL_Z, build_leaderboard
from arena.scheduler import Scheduler, SchedulerSettings
from arena.store import ArenaError, ledger_exists, read_entrants
from arena.submission import SubmissionError
from arena.uploads import UploadLimits, unpack_archive
from league.ledger import Store
from ludus.errors import UserError
from ludus.pages import PAGE_CSS

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
        # One rebuild at a time, so the last to start is the last to land: otherwise a rebuild the
        # scheduler began before a withdrawal could finish after the withdrawal's own and put the
        # withdrawn entrant back on the board.
        self._rebuild_lock = threading.Lock()
        self._uploads: dict[str, collections.deque] = {}
        self._uploads_lock = threading.Lock()
        self.scheduler_error: str | None = None
        (arena.directory / INCOMING_DIRNAME).mkdir(mode=0o700, parents=True, exist_ok=True)
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
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

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
                        "recent": [], "total_matches": 0}
            else:
                with Store.open(self.arena.directory, mode="read") as store:
                    data = leaderboard_json(build_leaderboard(store, self.config.recent_matches))
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
            owner = name_owner(store, name)
        if owner not in (None, account.name):
            raise ArenaError(f"the entrant name {name!r} belongs to another account; choose another name")
        folder = unpack_archive(archive, archive.parent / "unpacked", self.config.upload)
        submission = self.arena.validate(folder, self.arena.game)
        if submission.game is not None and self.arena.game is not None and submission.game != self.arena.game:
            raise ArenaError(f"the upload plays {submission.game!r}, this arena plays {self.arena.game!r}")
        with self.write_lock:
            with Store.open(self.arena.directory, mode="write") as store:
                claim_name(store, name, account.name)  # first: refuses a name another upload just took
            entrants = self.arena.list()
            version = 1 + sum(e.player_id.startswith(f"{name}@") for e in entrants)
            entrant = self.arena.enter(submission, f"{name}@{version}")
            twins = self.arena.same_content(entrant)
        result = {"player_id": entrant.player_id, "version": version, "kind": entrant.submission_kind.value,
                  "digest": entrant.digest, "account": account.name}
        if twins:
            result["warning"] = f"the same content as {', '.join(twins)}"
        return result

    def withdraw(self, account: Account, player_id: str) -> dict[str, Any]:
        base = player_id.split("@", 1)[0]
        with self.write_lock, Store.open(self.arena.directory, mode="write") as store:
            if name_owner(store, base) != account.name:
                raise ArenaError(f"{player_id!r} is not an entrant of account {account.name!r}")
            withdraw(store, player_id)
        self.refresh_board()
        return {"player_id": player_id, "withdrawn": True}

    # -- single records

    def entrant(self, player_id: str) -> dict[str, Any]:
        with Store.open(self.arena.directory, mode="read") as store:
            entrant = next((e for e in read_entrants(store) if e.player_id == player_id), None)
            if entrant is None:
                raise ArenaError(f"no entrant {player_id!r}")
            history = [{"seq": r.seq, "mu": r.mu, "sigma": r.sigma} for r in store.ratings_history(player_id)]
            matches = [m.result for m in store.iter_matches(kinds=("arena",), player_id=player_id)][-50:]
            gone = withdrawn(store)
            owner = name_owner(store, player_id.split("@", 1)[0])
        return {"player_id": player_id, "kind": entrant.kind, "submission_kind": entrant.submission_kind.value,
                "version": entrant.version, "digest": entrant.digest, "created_at": entrant.created_at,
                "account": owner, "withdrawn": player_id in gone, "history": history,
                "matches": [match_json(m) for m in reversed(matches)]}

    def match(self, match_id: int):
        return self.arena.match(match_id)


# ----------------------------------------------------------------------------------------- JSON


def match_json(match) -> dict[str, Any]:
    return {"id": match.match_id, "players": [s.player_id for s in match.seats],
            "teams": [s.team for s in match.seats], "returns": [s.episode_return for s in match.seats],
            "outcomes": [s.outcome for s in match.seats], "statuses": [s.status for s in match.seats],
            "errors": [s.error for s in match.seats], "moves": match.length, "seed": match.seed,
            "started_at": match.started_at, "duration_s": match.duration_s,
            "tournament": match.metadata.get("tournament")}


def leaderboard_json(board) -> dict[str, Any]:
    h2h = board.head_to_head
    n = len(h2h.players)
    return {
        "game": board.game, "total_matches": board.total_matches,
        "rows": [{"rank": r.rank, "player_id": r.player_id, "kind": r.kind, "submission_kind": r.submission_kind,
                  "mu": r.mu, "sigma": r.sigma, "low": r.mu - INTERVAL_Z * r.sigma, "high": r.mu + INTERVAL_Z * r.sigma,
                  "conservative": r.conservative, "games": r.games, "wins": r.wins, "draws": r.draws,
                  "losses": r.losses, "faults": dict(r.faults)} for r in board.rows],
        "head_to_head": {"players": list(h2h.players),
                         "games": [[h2h.games(i, j) for j in range(n)] for i in range(n)],
                         "score": [[h2h.score(i, j) for j in range(n)] for i in range(n)]},
        "recent": [match_json(m) for m in board.recent_matches],
    }


# ---------------------------------------------------------------------------------------- pages


_CSS = PAGE_CSS + """
nav a { margin-right: 14px; } .bar { position: relative; height: 10px; background: #eee; min-width: 160px; }
.bar span { position: absolute; top: 0; height: 10px; background: #7aa6d8; } .bar i { position: absolute; top: -2px;
width: 2px; height: 14px; background: #1f4e8c; } td.few { color: #bbb; background: #fafafa; }
.fault { color: #b00; } #result { white-space: pre-wrap; font-family: monospace; margin-top: 10px; }
form label { display: block; margin: 8px 0 2px; } input[type=text], input[type=password] { width: 360px; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _link(path: str, *parts: object) -> str:
    return path + "/".join(urllib.parse.quote(str(p), safe="") for p in parts)


def _page(title: str, body: str, script: str = "") -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            '<nav><a href="/">leaderboard</a><a href="/submit">submit</a><a href="/api/leaderboard">JSON</a></nav>'
            f"<h1>{_e(title)}</h1>{body}" + (f"<script>{script}</script>" if script else "") + "</body></html>\n")


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


def leaderboard_page(data: dict[str, Any], min_cell_games: int) -> str:
    rows = data["rows"]
    lo = min((r["low"] for r in rows), default=0.0)
    hi = max((r["high"] for r in rows), default=1.0)
    span = max(hi - lo, 1e-9)

    def bar(r: dict) -> str:
        left, width = 100 * (r["low"] - lo) / span, 100 * (r["high"] - r["low"]) / span
        return (f'<div class="bar"><span style="left:{left:.1f}%;width:{width:.1f}%"></span>'
                f'<i style="left:{100 * (r["mu"] - lo) / span:.1f}%"></i></div>')

    table = "".join(
        f'<tr class="entrant" data-player="{_e(r["player_id"])}"><td>{r["rank"]}</td>'
        f'<td class="name"><a href="{_e(_link("/entrants/", r["player_id"]))}">{_e(r["player_id"])}</a></td>'
        f'<td class="name">{_e(r["submission_kind"])}</td><td>{r["mu"]:.2f}</td>'
        f'<td>[{r["low"]:.1f}, {r["high"]:.1f}]</td><td>{bar(r)}</td><td>{r["conservative"]:.2f}</td>'
        f'<td class="games">{r["games"]}</td><td>{r["wins"]}/{r["draws"]}/{r["losses"]}</td>'
        f'<td class="name fault">{_e(", ".join(f"{n} {k}" for k, n in r["faults"].items()))}</td></tr>'
        for r in rows)
    board = (f'<table id="leaderboard"><tr><th>#</th><th class="name">entrant</th><th class="name">kind</th>'
             f"<th>mu</th><th>95% interval</th><th></th><th>mu-3&sigma;</th><th>games</th><th>W/D/L</th>"
             f'<th class="name">forfeits</th></tr>{table}</table>' if rows else
             '<p class="empty" id="leaderboard-empty">No entrants yet: <a href="/submit">submit one</a>.</p>')
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
    body = (f'<p class="meta">{_e(data["submission_kind"])} &middot; version {_e(data["version"])} &middot; account '
            f'{_e(data["account"] or "-")} &middot; digest {_e(data["digest"][:16])}'
            f'{" &middot; <b>withdrawn</b>" if data["withdrawn"] else ""}</p>'
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


# ------------------------------------------------------------------------------------------ app


def make_app(service: ArenaService):
    """The Starlette/FastAPI application of a service (its scheduler starts with the app)."""
    from league.replay import match_episode
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
        return error(404 if "no entrant" in str(exc) or "is not in the arena" in str(exc) else 400,
                     str(exc).replace("\n", " "))

    @app.get("/api/leaderboard")
    async def api_leaderboard():
        return Response(service.board.payload, media_type="application/json")

    @app.get("/api/entrants/{player_id:path}")
    def api_entrant(player_id: str):
        return service.entrant(player_id)

    @app.get("/api/matches/{match_id}")
    def api_match(match_id: int):
        return match_json(service.match(match_id))

    @app.get("/api/matches/{match_id}/episode")
    def api_episode(match_id: int):
        return match_episode(service.match(match_id))

    @app.post("/api/submissions")
    async def api_submit(request: Request, name: str = ""):
        account = await run_in_threadpool(service.account, request.headers.get("authorization"))
        if account is None:
            return error(401, "a valid API token is required (Authorization: Bearer <token>; the arena operator "
                              "makes one with `ludus arena token add NAME`)", **{"WWW-Authenticate": "Bearer"})
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
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > cap:
                        return error(413, f"the upload is larger than {cap >> 20} MiB")
                    out.write(chunk)
            if size == 0:
                return error(400, "the upload is empty: send the archive as the request body")
            try:
                result = await run_in_threadpool(service.accept, account, name, archive)
            except (SubmissionError, ArenaError) as exc:
                return error(400, str(exc).replace("\n", " "))
            return JSONResponse(result, status_code=201)
        finally:
            await run_in_threadpool(_remove_tree, work)

    @app.post("/api/entrants/{player_id:path}/withdraw")
    def api_withdraw(player_id: str, request: Request):
        account = service.account(request.headers.get("authorization"))
        if account is None:
            return error(401, "a valid API token is required (Authorization: Bearer <token>)",
                         **{"WWW-Authenticate": "Bearer"})
        return service.withdraw(account, player_id)

    @app.get("/", response_class=HTMLResponse)
    async def page_leaderboard():
        return leaderboard_page(service.leaderboard(), service.config.min_cell_games)

    @app.get("/entrants/{player_id:path}", response_class=HTMLResponse)
    def page_entrant(player_id: str):
        return entrant_page(service.entrant(player_id))

    @app.get("/matches/{match_id}", response_class=HTMLResponse)
    def page_match(match_id: int):
        episode = match_episode(service.match(match_id))
        return replay_html(episode, f"Arena match {match_id}",
                           '<p class="meta"><a href="/">leaderboard</a> &middot; '
                           f'<a href="/api/matches/{match_id}/episode">episode JSON</a></p>')

    @app.get("/submit", response_class=HTMLResponse)
    async def page_submit():
        return submit_page(service.config)

    return app


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def serve(arena: Arena, config: ServiceConfig = ServiceConfig()) -> None:
    """Run the service until interrupted (SIGINT/SIGTERM stop the scheduler after its current round)."""
    import uvicorn

    service = ArenaService(arena, config)
    print(f"ludus arena: serving {arena.directory} ({arena.game or 'no game yet'}) on http://{config.host}:"
          f"{config.port}/ ; scheduler {'on' if config.schedule else 'off'}", flush=True)
    uvicorn.run(make_app(service), host=config.host, port=config.port, log_level="warning", access_log=False)
