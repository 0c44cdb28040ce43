"""`ludus matches RUN|--arena DIR`: a ledger's matches, one line each, with filters.

Reads the ledger read-only (works while a run trains or an arena plays). A league run's matches
carry the iteration that played them (`iteration` in the match metadata, recorded since issue 79);
an arena's carry their tournament's number, which `--iteration` filters on there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ludus.errors import UserError
from ludus.league.records.ledger import MATCH_KINDS, SEAT_STATUSES, MatchResult, Store

DEFAULT_LIMIT = 50
"""Matches shown when no --limit is given: the newest ones that pass the filters."""


@dataclass(frozen=True)
class MatchFilter:
    """Which matches `ludus matches` lists (None: any)."""

    player: str | None = None
    """Only matches with a seat of this player id (e.g. main, main@3, anchor:random)."""
    status: str | None = None
    """Only matches with a seat of this status (one of `SEAT_STATUSES`: ok, error, timeout, invalid)."""
    kind: str | None = None
    """Only matches of this kind (one of `MATCH_KINDS`: training, rating, evaluation, arena)."""
    iteration: int | None = None
    """Only matches of this league iteration (1-based), or of this arena tournament."""
    game: str | None = None
    """Only matches of this game (a run of several games records each match under its own)."""


@dataclass(frozen=True)
class MatchListing:
    """The newest matches that pass a filter, oldest first, and how many passed in all."""

    matches: tuple[MatchResult, ...]
    total: int
    """Matches that passed the filter (more than `matches` holds when a limit cut them)."""
    ledger_matches: int
    """Matches in the whole ledger."""


def round_of(match: MatchResult) -> int | None:
    """The league iteration (or arena tournament) a match was played in, if recorded."""
    value = match.metadata.get("iteration", match.metadata.get("tournament"))
    return int(value) if isinstance(value, (int, float)) else None


def list_matches(directory: str | Path, which: MatchFilter, limit: int | None = DEFAULT_LIMIT) -> MatchListing:
    """The newest `limit` (None: all) matches of the ledger in `directory` that pass `which`."""
    if which.kind is not None and which.kind not in MATCH_KINDS:
        raise UserError(f"unknown match kind {which.kind!r}; kinds: {', '.join(MATCH_KINDS)}")
    if which.status is not None and which.status not in SEAT_STATUSES:
        raise UserError(f"unknown seat status {which.status!r}; statuses: {', '.join(SEAT_STATUSES)}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit} (leave it out for the newest {DEFAULT_LIMIT})")
    with Store.open(Path(directory), mode="read") as store:
        if which.player is not None and store.player(which.player) is None:
            import difflib

            players = [p.player_id for p in store.players()]
            close = difflib.get_close_matches(which.player, players, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (players: {', '.join(players[:8])})"
            raise UserError(f"no player {which.player!r} in the ledger of {directory}{hint}")
        kept: deque[MatchResult] = deque(maxlen=limit)
        total = 0
        kinds = None if which.kind is None else [which.kind]
        for recorded in store.iter_matches(kinds=kinds, player_id=which.player):
            match = recorded.result
            if which.status is not None and not any(s.status == which.status for s in match.seats):
                continue
            if which.iteration is not None and round_of(match) != which.iteration:
                continue
            if which.game is not None and match.game_id != which.game:
                continue
            kept.append(match)
            total += 1
        if which.game is not None and total == 0 and store.count_matches() > 0:
            games = sorted({r.result.game_id for r in store.iter_matches()})
            if which.game not in games:
                raise UserError(f"no match of game {which.game!r} in the ledger of {directory} (its games: "
                                f"{', '.join(games)})")
        return MatchListing(tuple(kept), total, store.count_matches())


def _returns(value: float) -> str:
    return f"{value:g}"


def format_match(match: MatchResult, game: bool = False) -> str:
    """One line: id, kind, iteration, (with `game`, the match's game,) each seat's player and
    return, length, and any fault."""
    when = round_of(match)
    seats = "  ".join(f"{s.player_id} {_returns(s.episode_return)}" for s in match.seats)
    faults = "; ".join(f"{s.player_id} {s.status}" + (f" ({s.error})" if s.error else "")
                       for s in match.seats if s.status != "ok")
    return (f"{match.match_id:>8}  {match.kind:<10} {'-' if when is None else when:>5}  {match.length:>5}  "
            + (f"{match.game_id}  " if game else "") + f"{seats}" + (f"   [{faults}]" if faults else ""))


def format_listing(listing: MatchListing, directory: str, arena: bool) -> str:
    """The header, one line per match, and a footer that says what was left out and what next."""
    several = len({m.game_id for m in listing.matches}) > 1  # a run of several games: say which each played
    lines = [f"{'match':>8}  {'kind':<10} {'tour' if arena else 'iter':>5}  {'steps':>5}  "
             + ("game  " if several else "") + "seats (player return)"]
    lines += [format_match(m, several) for m in listing.matches]
    shown = len(listing.matches)
    replay = f"ludus arena replay ID --arena {directory}" if arena else f"ludus replay {directory} ID"
    if listing.total == 0:
        lines.append(f"(no match passes the filters; the ledger holds {listing.ledger_matches:,})")
    else:
        cut = f", the newest {shown:,} shown (--limit N, --all)" if shown < listing.total else ""
        lines.append(f"({listing.total:,} of {listing.ledger_matches:,} matches pass the filters{cut}; "
                     f"`{replay}` replays one)")
    return "\n".join(lines)
