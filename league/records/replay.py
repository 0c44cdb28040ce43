"""Re-simulating a recorded match: seed + moves -> the same game, step by step.

The ledger stores a match's moves as its history: the actions applied, in order, with the
acting seats of a simultaneous step in seat order. Chance follows from the seed. A text-move
game's match also stores every move's text (match metadata "texts"): it replays from those.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ludus.games.core import Game, forfeit_returns, is_over
from ludus.errors import UserError


class ReplayError(UserError):
    """Recorded moves that do not fit the game (illegal, too many or too few)."""


MATCH_ID_LIMIT = 1 << 63
"""Match ids are SQLite INTEGERs (signed 64-bit) and never negative: every id is below this."""


def check_match_id(match_id: int) -> int:
    """`match_id` if a ledger can hold it, else a one-line `ReplayError`: sqlite3 raises
    OverflowError for an integer past 64 bits, which would reach the user as a traceback."""
    if not 0 <= match_id < MATCH_ID_LIMIT:
        raise ReplayError(f"match {match_id} cannot exist: match ids are whole numbers from 0 to 2^63-1")
    return match_id


def recorded_texts(match) -> list[str] | None:
    """The move texts a recorded match (`MatchResult`) of a text-move game stores, else None."""
    texts = match.metadata.get("texts") if isinstance(match.metadata, dict) else None
    if texts is None:
        return None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ReplayError(f"match {match.match_id}: its recorded move texts are not a list of strings")
    return texts


def reasoning_entries(match) -> list[tuple[int, int, str]]:
    """(move index, seat, whole response) of a recorded match's metadata "reasoning" (what agents
    that reason aloud wrote beside each move); malformed entries are left out, [] without."""
    entries = match.metadata.get("reasoning") if isinstance(match.metadata, dict) else None
    return [(entry[0], entry[1], entry[2]) for entry in (entries if isinstance(entries, list) else ())
            if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int)
            and isinstance(entry[1], int) and isinstance(entry[2], str)]


def recorded_reasoning(match) -> dict[int, list[str]]:
    """What agents that reason aloud wrote, by move index: ``"seat S wrote: ..."`` lines for the
    text transcript (`reasoning_entries`); {} without."""
    notes: dict[int, list[str]] = {}
    for index, seat, text in reasoning_entries(match):
        notes.setdefault(index, []).append(f"   seat {seat} wrote: {text!r}")
    return notes


def replay_moves(game: Game, seed: int, moves: Sequence[int], header: str = "",
                 texts: Sequence[str] | None = None, notes: dict[int, list[str]] | None = None) -> tuple[np.ndarray, str]:
    """Play `moves` in `game` from `seed` (a text-move game: `texts`, every move's text); returns
    (final returns, a text transcript with boards and `notes`, lines shown after the move of that
    index: `recorded_reasoning`)."""
    lines, position = replay_prefix(game, seed, moves, stop_when_over=True, texts=texts, notes=notes)
    if not is_over(game):
        raise ReplayError(f"the recorded moves end after {position} actions but the game is not over")
    if position != len(moves):
        raise ReplayError(f"the game ended after {position} of {len(moves)} recorded actions")
    returns = game.returns()
    lines.append(f"returns: {[float(r) for r in returns]}")
    return returns, "\n".join(([header] if header else []) + lines)


def replay_prefix(game: Game, seed: int, moves: Sequence[int], stop_when_over: bool = False,
                  texts: Sequence[str] | None = None, notes: dict[int, list[str]] | None = None) -> tuple[list[str], int]:
    """Apply recorded moves from `seed` (all of them, or until the game is over): the boards after
    each step as text lines, and how many moves were applied. Every move is checked for legality.
    A match cut short (a forfeit in the arena) replays its prefix with this."""
    lines: list[str] = []
    position = before = 0
    for actions, board, position in replayed_steps(game, seed, moves, stop_when_over, texts):
        if actions:
            lines.append("-- " + ", ".join(f"seat {s} plays {a!r}" if isinstance(a, str) else f"seat {s} plays {a}"
                                           for s, a in actions.items()))
            for index in range(before, position):
                lines.extend((notes or {}).get(index, ()))
        before = position
        lines.append(board)
    return lines, position


def replayed_steps(game: Game, seed: int, moves: Sequence[int], stop_when_over: bool = False,
                   texts: Sequence[str] | None = None) -> Iterator[tuple[dict[int, int | str], str, int]]:
    """(actions of the step, the board after it, moves applied so far) for the start ({}) and every
    step the recorded moves make from `seed`; each move is checked for legality. A text-move game
    with `texts` replays every move's text (the game judges it again, as it did)."""
    if texts is not None:
        if not game.spec.text_moves:
            raise ReplayError(f"{game.spec.id} takes actions, but the match records move texts")
        if len(texts) != len(moves):
            raise ReplayError(f"the match records {len(texts)} move texts for {len(moves)} moves")
    game.reset(int(seed))
    position = 0
    yield {}, game.render(), position
    while position < len(moves) and not (stop_when_over and is_over(game)):
        movers = game.to_move()
        if not movers:
            raise ReplayError(f"the game ended after {position} of {len(moves)} recorded actions")
        if position + len(movers) > len(moves):
            raise ReplayError(f"the recorded moves end inside a step after {position} actions")
        if texts is not None:
            said = {seat: str(texts[position + i]) for i, seat in enumerate(movers)}
            position += len(movers)
            game.step_text(said)  # type: ignore[attr-defined]
            yield dict(said), game.render(), position
            continue
        actions = {}
        for seat in movers:
            action = int(moves[position])
            position += 1
            if not game.legal_mask(seat)[action]:
                raise ReplayError(f"recorded action {action} of seat {seat} at move {position} is illegal")
            actions[seat] = action
        game.step(actions)
        yield actions, game.render(), position


def replay_forfeit(game: Game, seed: int, moves: Sequence[int], forfeited: Sequence[bool],
                   header: str = "", texts: Sequence[str] | None = None,
                   notes: dict[int, list[str]] | None = None) -> tuple[tuple[float, ...], str]:
    """Replay a match that ended by forfeit (`forfeited`: per seat): its moves are the prefix of a
    game that is not over; returns (the returns the forfeit rule gives, a transcript)."""
    lines, _ = replay_prefix(game, seed, moves, texts=texts, notes=notes)
    if is_over(game):
        raise ReplayError(f"the match is recorded as a forfeit but its {len(moves)} moves finish the game")
    returns = forfeit_returns(game.spec, forfeited)
    lines += [f"seat {s} forfeits" for s, f in enumerate(forfeited) if f]
    lines.append(f"returns (by forfeit): {list(returns)}")
    return returns, "\n".join(([header] if header else []) + lines)


def match_episode(match) -> dict:
    """A recorded match (`ludus.league.records.ledger.MatchResult`) as an episode for replay players and other
    tools, in the spirit of Kaggle's episode JSON: who played which seat, and one step per turn with
    the board (`Game.render()`) after it and the actions that led to it (step 0: the start).

    Re-simulated from the seed and the moves; a match cut short by a forfeit replays its prefix
    and ends with the forfeit. Boards are the game's own text (for dialogue games: each side's
    private context and the transcript so far), control characters escaped."""
    from ludus.games import registry
    from ludus.text import printable

    said: dict[int, list] = {}
    for index, seat, text in reasoning_entries(match):
        said.setdefault(index, []).append([seat, printable(text)])
    steps, before = [], 0
    for actions, board, position in replayed_steps(registry.make(match.game_id), match.seed, match.moves or (),
                                                   stop_when_over=True, texts=recorded_texts(match)):
        step = {"actions": [[seat, printable(action) if isinstance(action, str) else action]
                            for seat, action in actions.items()], "board": printable(board)}
        wrote = [w for index in range(before, position) for w in said.get(index, ())]
        if wrote:
            step["wrote"] = wrote  # [seat, whole response]: the reasoning beside the move
        steps.append(step)
        before = position
    return {
        "format": "ludus-episode-1", "id": match.match_id, "kind": match.kind, "game": match.game_id,
        "seed": match.seed, "players": [s.player_id for s in match.seats], "teams": [s.team for s in match.seats],
        "returns": [s.episode_return for s in match.seats], "outcomes": [s.outcome for s in match.seats],
        "statuses": [s.status for s in match.seats], "errors": [printable(s.error) for s in match.seats],
        "forfeit": any(s.status != "ok" for s in match.seats), "steps": steps,
    }
