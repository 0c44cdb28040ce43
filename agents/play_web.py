"""The HTTP side of the web seat (`ludus.agents.human_seat`): the play API that `ludus arena serve`
mounts (`add_play_routes`) and the whole local server of `ludus play --web` (`serve_local`).
Needs the ``serve`` extra (FastAPI, uvicorn); the rest of Ludus does not import this module until
a server starts.

No ``from __future__ import annotations`` here: FastAPI reads the handlers' annotations (``Request``)
as objects.
"""

import itertools
import json
import secrets
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from ludus.agents.human_seat import (LOCAL_PLAYER, MAX_BODY_BYTES, GameOver, HumanGame, HumanGames, HumanSeat,
                                     HumanSettings, MoveRefused, StartRequest, check_web_playable, local_match,
                                     parse_start)
from ludus.errors import UserError


def add_play_routes(app, games: HumanGames, identify: Callable[[Any], Any],
                    start: Callable[[str, StartRequest], HumanGame], num_seats: Callable[[], int]) -> None:
    """The play API on a FastAPI `app`: ``POST /api/play`` (start; body {"opponent", "seat"}),
    ``GET /api/play/ID`` (state), ``POST /api/play/ID/move`` (body {"action": N} or {"text": "..."}).

    `identify(request)` names who asks, or returns the response that refuses them (401/429);
    `start(who, request)` makes the game (`MoveRefused` or `UserError` refuse it)."""
    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message.replace("\n", " ")}, status_code=status)

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            raise MoveRefused(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise MoveRefused(f"the request body is larger than {MAX_BODY_BYTES} bytes", 413)
        try:
            return json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise MoveRefused("the request body is not JSON") from None

    def refused(exc: UserError) -> JSONResponse:
        return error(getattr(exc, "status", 400), str(exc))

    @app.post("/api/play")
    async def api_play_start(request: Request):
        who = await run_in_threadpool(identify, request)
        if not isinstance(who, str):
            return who
        try:
            body = parse_start(await read_json(request), num_seats())
            game = await run_in_threadpool(start, who, body)
            await run_in_threadpool(_wait_started, game)
            return JSONResponse(game.state(who), status_code=201)
        except UserError as exc:
            return refused(exc)

    @app.get("/api/play/{game_id}")
    def api_play_state(game_id: str, request: Request):
        who = identify(request)
        if not isinstance(who, str):
            return who
        try:
            return games.get(game_id).state(who)
        except UserError as exc:
            return refused(exc)

    @app.post("/api/play/{game_id}/move")
    async def api_play_move(game_id: str, request: Request):
        who = await run_in_threadpool(identify, request)
        if not isinstance(who, str):
            return who
        try:
            game = games.get(game_id)
            body = await read_json(request)
            if not isinstance(body, dict) or set(body) - {"action", "text"}:
                raise MoveRefused('send a JSON object: {"action": N} or {"text": "..."}')
            game.move(who, body.get("action"), body.get("text"))
            await run_in_threadpool(_wait_answered, game)
            return game.state(who)
        except UserError as exc:
            return refused(exc)


def _wait_started(game: HumanGame, timeout: float = 5.0) -> None:
    """Let the match reach its first position before answering (the page then draws it at once)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not game.settled():
        time.sleep(0.02)


def _wait_answered(game: HumanGame, timeout: float = 2.0) -> None:
    """Give a quick opponent a moment to answer, so the reply to a move usually shows its answer too."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and game._waiting is None and game.finished_at is None:
        time.sleep(0.02)


def serve_local(game_id: str, against: str, seat: int = 0, seed: int | None = None, port: int = 8001,
                settings: HumanSettings = HumanSettings(), ready: Callable[[str], None] = print) -> None:
    """`ludus play GAME --against X --web`: the play page on http://127.0.0.1:PORT/ for one person,
    against `against` (a bot, a snapshot, a run directory's output policy), with no accounts and
    nothing recorded. Listens on loopback only, and answers only requests addressed to it by a
    loopback name (a web page elsewhere cannot reach it through DNS rebinding)."""
    import uvicorn

    from ludus.agents.play import resolve_opponent
    from ludus.games import registry
    from ludus.play_page import play_page, play_security_headers

    check_web_playable(game_id)
    spec = registry.spec(game_id)
    opponent = resolve_opponent(against, spec)  # fails here, before serving, if it cannot play
    games = HumanGames(settings)
    app = FastAPI(title="ludus play", docs_url=None, redoc_url=None, openapi_url=None)
    allowed_hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    numbers = itertools.count()  # with --seed, the k-th game of the server plays seed + k

    @app.middleware("http")
    async def loopback_only(request: Request, call_next):
        if request.headers.get("host", "") not in allowed_hosts:
            return JSONResponse({"error": f"this server answers only http://127.0.0.1:{port}/"}, status_code=421)
        response = await call_next(request)
        for key, value in play_security_headers():
            response.headers[key] = value
        return response

    def identify(request: Request) -> str:
        return LOCAL_PLAYER

    def start(who: str, request: StartRequest) -> HumanGame:
        game_seed = secrets.randbits(31) if seed is None else seed + next(numbers)
        players = tuple(LOCAL_PLAYER if s == request.seat else against for s in range(spec.num_players))

        def play(human: HumanSeat, watch: Callable[[Any], None]) -> GameOver:
            return local_match(game_id, opponent, request.seat, game_seed, human, watch)

        return games.start(HumanGame(game_id, request.seat, who, players, play, settings))

    add_play_routes(app, games, identify, start, lambda: spec.num_players)

    @app.get("/", response_class=HTMLResponse)
    def page():
        return play_page(game_id, spec.num_players, opponents=[against], token=False, default_seat=seat,
                         title=f"Play {game_id}", nav="")

    ready(f"ludus play: {game_id} against {against} on http://127.0.0.1:{port}/ (Ctrl-C stops)")
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    finally:
        games.close()
