"""A person's seat in a game played over HTTP: the play page of `ludus arena serve` (arena/human.py)
and of `ludus play --web`; the HTTP side is `ludus.agents.play_web`.

Each game runs in its own thread through a match loop — the arena's `play_match`, which plays the
opponent exactly as in an agent match, or `local_match` here for an in-process opponent — and the
person's seat in it is a `HumanSeat`: the loop asks it for a move like any in-process player, and
it waits for the person's move to arrive over HTTP (`HumanGame.move`). After every step the loop
shows the game to `HumanGame.watch`, which keeps a frozen `Position` of what the person's own seat
may see (the board, or the seat's text in a text-move game) for the page to poll.

Refusals are checked before a move reaches the game: a move by anyone but the seated person (403),
a move when it is not their turn or the game is over (409), an action that is not legal or text
that is empty, too long or not printable (400). A text-move game judges the text itself, under its
own rule for an invalid move, as it does an agent's. A person who does not move within
`HumanSettings.move_timeout_s` of their turn forfeits (status 'timeout'), as an agent that does
not answer does.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ludus.agents.play import result_words
from ludus.agents.policy import ActBatch, ActOutput, Policy, SeatForfeit
from ludus.errors import UserError
from ludus.games.core import Game, GameSpec, forfeit_returns, is_over

log = logging.getLogger(__name__)
MAX_LEGAL_LISTED = 400
"""Legal moves listed to the page at most (a longer list is cut: the page could not show it anyway)."""
MAX_BODY_BYTES = 16 << 10
"""Largest JSON body the play API reads."""
LOCAL_PLAYER = "person"
"""Who plays at `ludus play --web` (no accounts there)."""


class MoveRefused(UserError):
    """A play request the game cannot take; `status` is the HTTP status that answers it."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class GameAborted(Exception):
    """The server stopped the game (it is shutting down): nothing is recorded."""


@dataclass(frozen=True)
class HumanSettings:
    """Limits of the web seats of one server."""

    move_timeout_s: float = 300.0
    """A person who has not moved this long after their turn began forfeits (status 'timeout')."""
    max_games: int = 8
    """Games in progress at once on the server (each may hold a sandboxed opponent's process)."""
    max_text_chars: int = 2000
    """Longest text move (text-move games)."""
    finished_kept_s: float = 900.0
    """How long a finished game stays readable at its URL."""

    def __post_init__(self) -> None:
        if not (self.move_timeout_s > 0 and self.max_games >= 1 and self.max_text_chars >= 1):
            raise UserError(f"human seats need move_timeout_s > 0, max_games >= 1 and max_text_chars >= 1, got "
                            f"{self.move_timeout_s}, {self.max_games}, {self.max_text_chars}")


@dataclass(frozen=True)
class LegalMove:
    action: int
    label: str
    """What the page shows on its button (a text view's answer, a text game's move text, the number)."""


@dataclass(frozen=True)
class BoardLayout:
    """A board the page draws as a grid of clickable cells."""

    rows: int
    cols: int
    click: str
    """'cell': clicking row r, column c plays action r * cols + c; 'column': it plays action c."""


@dataclass(frozen=True)
class Position:
    """What the person's page shows, as of the last step (their own seat's view only)."""

    view: str
    """The board as text, or the seat's text (text-move games, games with a text view)."""
    to_move: tuple[int, ...]
    legal: tuple[LegalMove, ...]
    """The person's legal moves when they are to move; () otherwise."""
    grid: tuple[str, ...] | None
    """The board's rows of cells (one character each) when the game has a `BoardLayout`."""
    moves: int
    over: bool
    returns: tuple[float, ...]
    last: str
    """What the other seats played in the last step, for people ('' at the start)."""


@dataclass(frozen=True)
class GameOver:
    """How a game at a web seat ended."""

    returns: tuple[float, ...]
    statuses: tuple[str, ...]
    """Per seat: 'ok', or the fault that forfeited it ('timeout', 'error', 'invalid')."""
    reasons: tuple[str, ...]
    """Per seat: why it forfeited ('' for 'ok')."""
    match_id: int | None = None
    """The ledger's id of the recorded match (arena games); None when nothing is recorded."""


@dataclass(frozen=True)
class HumanMove:
    action: int | None = None
    text: str | None = None


_STOP = object()


def board_layout(spec: GameSpec) -> BoardLayout | None:
    """A grid for board games whose actions are cells or columns of their (planes, rows, cols)
    observation (tic-tac-toe, connect four); None: the page lists the legal moves instead."""
    shape = spec.observation_shape
    if spec.text_moves or spec.simultaneous or len(shape) != 3:
        return None
    rows, cols = shape[1], shape[2]
    if spec.num_actions == rows * cols:
        return BoardLayout(rows, cols, "cell")
    if spec.num_actions == cols:
        return BoardLayout(rows, cols, "column")
    return None


def check_web_playable(game_id: str) -> None:
    """Refuse a game the page cannot show a person fairly; the message says what to use instead."""
    from ludus.games import registry
    from ludus.games.text import has_text_view

    spec = registry.spec(game_id)
    if spec.observation_dtype == "int64" and not spec.text_moves:
        raise UserError(f"{game_id!r} is a token dialogue game: the browser seat does not play it yet; "
                        f"`ludus play {game_id} --against BOT` plays it in the terminal")
    if not spec.perfect_information and not spec.text_moves and not has_text_view(game_id):
        raise UserError(f"{game_id!r} hides information and has no per-seat text view, so a page would show the "
                        f"opponent's secrets; `ludus play` plays it in the terminal")
    if any(len(side) != 1 for side in spec.sides):
        raise UserError(f"{game_id!r} is a team game: a person takes one seat of a two-player game at the web seat")


def seat_view(game: Game, seat: int) -> str:
    """What `seat` may see, as text: a text-move game's text for the seat, a hidden-information
    game's text view, else the whole board (`Game.render`)."""
    spec = game.spec
    if spec.text_moves:
        return game.text(seat)
    if not spec.perfect_information:
        from ludus.games.text import text_view

        view = text_view(spec.id)
        mask = game.legal_mask(seat) if seat in game.to_move() else np.zeros(spec.num_actions, bool)
        return f"{view.role(seat)}\n{view.state(game.observation(seat), seat, mask)}"
    return game.render()


def legal_moves(game: Game, seat: int) -> tuple[LegalMove, ...]:
    """The seat's legal moves with the labels the page shows."""
    from ludus.games.text import has_text_view, text_view

    mask = game.legal_mask(seat)
    legal = np.flatnonzero(mask)[:MAX_LEGAL_LISTED].tolist()
    spec = game.spec
    if spec.text_moves:
        if not game.lists_moves():
            return ()  # free text: the person types it
        return tuple(LegalMove(a, game.move_text(seat, a)) for a in legal)
    if has_text_view(spec.id):
        names = {a: answer for answer, a in text_view(spec.id).answers(game.observation(seat), seat, mask).items()}
        return tuple(LegalMove(a, names.get(a, str(a))) for a in legal)
    return tuple(LegalMove(a, str(a)) for a in legal)


def position_of(game: Game, seat: int, layout: BoardLayout | None, last: str) -> Position:
    view = seat_view(game, seat)
    grid = None
    if layout is not None:
        lines = view.strip("\n").splitlines()
        if len(lines) == layout.rows and all(len(line) == layout.cols for line in lines):
            grid = tuple(lines)
    over = is_over(game)
    movers = () if over else tuple(game.to_move())
    return Position(view, movers, legal_moves(game, seat) if seat in movers else (), grid, len(game.history()),
                    over, tuple(float(r) for r in game.returns()), last)


class HumanGame:
    """One game with a person at seat `seat`, played in its own thread by `play`.

    `play(human, watch)` runs the whole match with `human` (a `HumanSeat`) at the person's seat,
    calling `watch(game)` after the reset and after every step, and returns its `GameOver`."""

    def __init__(self, game_id: str, seat: int, owner: str, players: tuple[str, ...],
                 play: Callable[["HumanSeat", Callable[[Game], None]], GameOver], settings: HumanSettings):
        from ludus.games import registry

        self.id = secrets.token_urlsafe(12)
        self.game_id = game_id
        self.spec = registry.spec(game_id)
        self.seat = seat
        self.owner = owner
        self.players = players
        self.settings = settings
        self.layout = board_layout(self.spec)
        self._play = play
        self._lock = threading.Lock()
        self._moves: queue.Queue = queue.Queue()
        self._position: Position | None = None
        self._waiting: np.ndarray | None = None
        """The person's legal mask while the match waits for their move; None otherwise."""
        self._deadline = 0.0
        self._history_seen = 0
        self._texts_seen = 0
        self.over: GameOver | None = None
        self.error: str | None = None
        self.finished_at: float | None = None
        self.started_at = time.time()
        self.thread = threading.Thread(target=self._run, name=f"ludus-human-{self.id[:6]}", daemon=True)

    # -- the match thread

    def _run(self) -> None:
        try:
            over = self._play(HumanSeat(self), self.watch)
            with self._lock:
                self.over = over
        except GameAborted:
            with self._lock:
                self.error = "the server stopped this game before it ended; nothing was recorded"
        except Exception as exc:  # the page says why; the server log has the traceback
            log.exception("the game %s at a web seat failed", self.id)
            with self._lock:
                self.error = f"the game failed: {type(exc).__name__}: {str(exc)[:300]}"
        finally:
            with self._lock:
                self.finished_at = time.monotonic()
                self._waiting = None

    def watch(self, game: Game) -> None:
        """Called by the match loop after the reset and after every step: keep the person's view."""
        history = game.history()
        new = history[self._history_seen:]
        last = ""
        if new:
            texts = game.record().texts if self.spec.text_moves else ()
            said = texts[self._texts_seen:] if texts else ()
            last = "; ".join(repr(t) for t in said) if said else " ".join(str(a) for a in new)
            self._texts_seen = len(texts)
        self._history_seen = len(history)
        position = position_of(game, self.seat, self.layout, last)
        with self._lock:
            self._position = position

    def await_move(self, seat: int, mask: np.ndarray) -> HumanMove:
        """Block the match until the person moves (`move`); `SeatForfeit` after the timeout."""
        timeout = self.settings.move_timeout_s
        with self._lock:
            self._waiting = np.array(mask, dtype=bool)
            self._deadline = time.monotonic() + timeout
        try:
            move = self._moves.get(timeout=timeout)
        except queue.Empty:
            with self._lock:
                self._waiting = None  # from here on `move` refuses, so the queue stays as it is now
                try:
                    move = self._moves.get_nowait()  # it came in at the last moment
                except queue.Empty:
                    raise SeatForfeit("timeout", f"did not move within {timeout:g} s") from None
        if move is _STOP:
            raise GameAborted()
        return move

    def settled(self) -> bool:
        """The match waits for the person, or for the opponent to think, or is over: what the
        state says now stays true until someone moves (between a step and the person's turn it
        would say 'waiting' for a moment)."""
        with self._lock:
            if self._waiting is not None or self.finished_at is not None:
                return True
            return self._position is not None and self.seat not in self._position.to_move

    def abort(self) -> None:
        """Stop the game at the person's next turn (or now, if it waits for them); nothing is recorded."""
        self._moves.put(_STOP)

    # -- the HTTP side

    def move(self, who: str, action: Any = None, text: Any = None) -> None:
        """The person's move: an action number (board games, listed moves) or text (text-move
        games); `MoveRefused` says why one is not taken."""
        if who != self.owner:
            raise MoveRefused(f"this game is {self.owner!r}'s; you are not seated in it", 403)
        with self._lock:
            if self.finished_at is not None:
                raise MoveRefused("the game is over", 409)
            mask = self._waiting
            if mask is None:
                raise MoveRefused("it is not your turn: wait until the page says it is", 409)
            move = self._checked(mask, action, text)
            self._waiting = None  # taken: a second post before the match asks again is refused
            self._moves.put(move)

    def _checked(self, mask: np.ndarray, action: Any, text: Any) -> HumanMove:
        if (action is None) == (text is None):
            raise MoveRefused('send one move: {"action": N} or {"text": "..."}')
        if text is not None:
            if not self.spec.text_moves:
                raise MoveRefused(f"{self.game_id} takes moves as action numbers, not text: send {{\"action\": N}}")
            if not isinstance(text, str) or not text.strip():
                raise MoveRefused("the move text is empty: type a move")
            if len(text) > self.settings.max_text_chars:
                raise MoveRefused(f"the move text has {len(text)} characters; at most {self.settings.max_text_chars}")
            if not text.isprintable():
                raise MoveRefused("the move text has control characters (newlines, tabs, ...): type it on one line")
            return HumanMove(text=text)
        if isinstance(action, bool) or not isinstance(action, int):
            raise MoveRefused(f"the action must be a whole number, got {str(action)[:40]!r}")
        if not 0 <= action < len(mask) or not mask[action]:
            legal = np.flatnonzero(mask)
            listed = " ".join(map(str, legal[:40].tolist())) + (" ..." if len(legal) > 40 else "")
            raise MoveRefused(f"action {action} is not legal now; legal: {listed}")
        return HumanMove(action=action)

    def state(self, who: str) -> dict[str, Any]:
        """The game as the page shows it (JSON); only the seated person may read it (403)."""
        if who != self.owner:
            raise MoveRefused(f"this game is {self.owner!r}'s; you are not seated in it", 403)
        with self._lock:
            position, waiting, over, error = self._position, self._waiting, self.over, self.error
            left = max(0.0, self._deadline - time.monotonic()) if waiting is not None else None
            finished = self.finished_at is not None
        status = ("failed" if error else "over" if finished else "your-turn" if waiting is not None
                  else "waiting" if position is not None else "starting")
        data: dict[str, Any] = {
            "game_id": self.id, "game": self.game_id, "seat": self.seat, "players": list(self.players),
            "status": status, "text_moves": self.spec.text_moves, "seconds_left": left,
            "move_timeout_s": self.settings.move_timeout_s, "error": error,
            "layout": None if self.layout is None else {"rows": self.layout.rows, "cols": self.layout.cols,
                                                         "click": self.layout.click}}
        if position is not None:
            data.update(view=position.view, grid=None if position.grid is None else list(position.grid),
                        moves=position.moves, last=position.last,
                        legal=[{"action": m.action, "label": m.label} for m in position.legal]
                        if waiting is not None else [])
        if over is not None:
            data.update(returns=list(over.returns), statuses=list(over.statuses), reasons=list(over.reasons),
                        match_id=over.match_id, result=verdict(over, self.seat))
        return data


def verdict(over: GameOver, seat: int) -> str:
    """The result as the person reads it, with any forfeit."""
    forfeits = [f"seat {s} forfeited ({status}: {reason})" for s, (status, reason)
                in enumerate(zip(over.statuses, over.reasons)) if status != "ok"]
    return result_words(np.array(over.returns), seat) + (f"; {'; '.join(forfeits)}" if forfeits else "")


class HumanSeat:
    """The person's seat as an in-process player of a match loop: `act` waits for their move."""

    needs_history = False
    asks_a_person = True
    """Match loops ask this seat before the agents of a simultaneous step (`ludus.arena.match.play_match`)."""

    def __init__(self, game: HumanGame):
        self.game = game

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        move = self.game.await_move(int(batch.seats[0]), batch.mask[0])
        zero = np.zeros(1, np.float32)
        if move.text is not None:
            return ActOutput(np.zeros(1, np.int64), zero, zero, texts=[move.text])
        return ActOutput(np.array([move.action], np.int64), zero, zero)


class HumanGames:
    """The games at web seats of one server: at most `settings.max_games` in progress, one per
    person; finished games stay readable for `settings.finished_kept_s`."""

    def __init__(self, settings: HumanSettings = HumanSettings()):
        self.settings = settings
        self._games: dict[str, HumanGame] = {}
        self._lock = threading.Lock()

    def start(self, game: HumanGame) -> HumanGame:
        with self._lock:
            now = time.monotonic()
            for key, old in list(self._games.items()):
                if old.finished_at is not None and now - old.finished_at > self.settings.finished_kept_s:
                    del self._games[key]
            live = [g for g in self._games.values() if g.finished_at is None]
            mine = next((g for g in live if g.owner == game.owner), None)
            if mine is not None:
                raise MoveRefused(f"you already have a game in progress ({mine.id}): finish it first (or let it "
                                  f"time out after {self.settings.move_timeout_s:g} s without a move)", 409)
            if len(live) >= self.settings.max_games:
                raise MoveRefused(f"the server has {len(live)} games with people in progress, its limit; try again "
                                  f"in a few minutes", 503)
            self._games[game.id] = game
        game.thread.start()
        return game

    def get(self, game_id: str) -> HumanGame:
        with self._lock:
            game = self._games.get(game_id)
        if game is None:
            raise MoveRefused(f"no game {game_id[:40]!r} on this server (finished games are kept "
                              f"{self.settings.finished_kept_s:g} s)", 404)
        return game

    def close(self, wait_s: float = 10.0) -> None:
        """Abort every game in progress and wait for their threads (and opponents) to end."""
        with self._lock:
            games = list(self._games.values())
        for game in games:
            if game.finished_at is None:
                game.abort()
        for game in games:
            if game.thread.is_alive():
                game.thread.join(wait_s)


# ------------------------------------------------------------------------------ a local game


def local_match(game_id: str, opponent: Policy, seat: int, seed: int, human: HumanSeat,
                watch: Callable[[Game], None]) -> GameOver:
    """A game between the person (`human`, at `seat`) and an in-process `opponent` at every other
    seat (`ludus play --web`): the loop of `ludus play`, with the web seat's forfeit on timeout."""
    from ludus.games import registry

    game = registry.make(game_id)
    spec = game.spec
    rng = np.random.default_rng(seed)
    start_game = getattr(opponent, "start_game", None)  # a mixture draws its member for the game
    if start_game is not None:
        start_game(rng)
    game.reset(seed)
    watch(game)
    while not is_over(game):
        actions: dict[int, int] = {}
        texts: dict[int, str] = {}
        for mover in game.to_move():
            player = human if mover == seat else opponent
            try:
                out = player.act(ActBatch.at_seat(game, mover, player), rng)
            except SeatForfeit as exc:
                faulted = [s == mover for s in range(spec.num_players)]
                return GameOver(forfeit_returns(spec, faulted),
                                tuple(exc.status if f else "ok" for f in faulted),
                                tuple(exc.reason if f else "" for f in faulted))
            if spec.text_moves and out.texts is not None and out.texts[0] is not None:
                texts[mover], actions[mover] = str(out.texts[0]), -1
            else:
                actions[mover] = int(out.actions[0])
        if texts:
            game.step_text({s: texts[s] if s in texts else game.move_text(s, actions[s]) for s in actions})
        else:
            game.step(actions)
        watch(game)
    n = spec.num_players
    return GameOver(tuple(float(r) for r in game.returns()), ("ok",) * n, ("",) * n)


# ------------------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class StartRequest:
    """A validated ``POST /api/play`` body."""

    seat: int
    opponent: str | None = None
    """The entrant to play (the arena); None where the server has one opponent (`ludus play --web`)."""


def parse_start(body: Any, num_seats: int) -> StartRequest:
    """`{"seat": k, "opponent": "NAME"}` checked: a seat of the game, a short opponent name."""
    if not isinstance(body, dict):
        raise MoveRefused('send a JSON object: {"opponent": "NAME", "seat": 0}')
    unknown = set(body) - {"seat", "opponent"}
    if unknown:
        raise MoveRefused(f"unknown field(s) {sorted(unknown)[:5]}: send opponent and seat")
    seat = body.get("seat", 0)
    if isinstance(seat, bool) or not isinstance(seat, int) or not 0 <= seat < num_seats:
        raise MoveRefused(f"seat must be a whole number from 0 to {num_seats - 1}, got {str(seat)[:20]!r}")
    opponent = body.get("opponent")
    if opponent is not None and (not isinstance(opponent, str) or not 0 < len(opponent) <= 200):
        raise MoveRefused("opponent must be an entrant's name (a string of at most 200 characters)")
    return StartRequest(seat, opponent)
