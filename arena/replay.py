"""Arena replays: a recorded match as text, boards included, re-simulated from its seed and moves.

A match that was played to the end goes through `ludus.league.records.replay.replay_moves` (the league's
replayer, which also proves that the moves are legal and lead to the recorded returns). A match
that ended by forfeit stops before the game is over, which `replay_moves` rightly refuses; its
recorded prefix is replayed here and the transcript ends with who forfeited and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ludus.league.records.ledger import MatchResult
from ludus.text import printable
from ludus.league.records.replay import ReplayError, recorded_texts, replay_moves, replay_prefix


@dataclass(frozen=True)
class ArenaReplay:
    """A re-simulated arena match."""

    match_id: int
    transcript: str
    """Header, then every board with the move that led to it, then the result (control characters
    escaped: `ludus.text.printable`)."""
    recorded_returns: tuple[float, ...]
    replayed_returns: tuple[float, ...] | None
    """Returns the re-simulation reached; None for a forfeited match (it never reached the end)."""

    @property
    def consistent(self) -> bool:
        """The re-simulation agrees with the ledger (a forfeit: the moves replayed legally)."""
        return self.replayed_returns is None or self.replayed_returns == self.recorded_returns


def replay_match(match: MatchResult) -> ArenaReplay:
    """Re-simulate a recorded arena match and describe it."""
    from ludus.games import registry

    moves = match.moves
    if moves is None:
        raise ReplayError(f"match {match.match_id} has no recorded moves")
    meta = match.metadata
    header = [f"match {match.match_id} ({match.kind}, tournament {meta.get('tournament', '?')}, "
              f"{meta.get('format', '?')}): {match.game_id}, seed {match.seed}, {len(moves)} moves"]
    for seat in match.seats:
        line = f"  seat {seat.seat}: {seat.player_id} ({seat.player_version}) return {seat.episode_return:g}, " \
               f"{seat.status}"
        if seat.error:
            line += f": {seat.error}"
        header.append(line)
    recorded = tuple(s.episode_return for s in match.seats)
    game = registry.make(match.game_id)
    faulted = [s for s in match.seats if s.status != "ok"]
    if not faulted:
        returns, transcript = replay_moves(game, match.seed, moves, header="\n".join(header),
                                           texts=recorded_texts(match))
        replayed = tuple(float(r) for r in returns)
        verdict = ("replay check: the moves reproduce the recorded returns" if replayed == recorded
                   else f"replay check FAILED: recorded returns {list(recorded)}, replayed {list(replayed)}")
        return ArenaReplay(match.match_id, printable(f"{transcript}\n{verdict}"), recorded, replayed)
    lines = header + replay_prefix(game, match.seed, moves, texts=recorded_texts(match))[0]
    for seat in faulted:
        lines.append(f"seat {seat.seat} ({seat.player_id}) forfeits: {seat.status}: {seat.error}")
        tail = seat.metadata.get("stderr", "")
        if tail:
            lines.append(f"  last stderr of {seat.player_id}:")
            lines.extend(f"  | {line[:200]}" for line in tail.strip().splitlines()[-10:])
    lines.append(f"returns (by forfeit): {list(recorded)}")
    # stderr tails and fault reasons are the agent's own text: escaped, they cannot drive a terminal
    return ArenaReplay(match.match_id, printable("\n".join(lines)), recorded, None)
