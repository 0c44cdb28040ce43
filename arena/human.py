"""A person's seat at `ludus arena serve`: a signed-in account plays an entrant on the ``/play`` page.

The person is the leaderboard member ``human:ACCOUNT`` (`ludus.arena.store.ensure_human`, registered
with their first recorded game; never scheduled). Their opponent is an active entrant, played exactly as in
the scheduler's matches: `entrant_agents` makes its player (a sandboxed process for a submission,
an in-process bot for a built-in one) with the arena's sandbox limits and time control, and the
match is the arena's `play_match` with the person's `HumanSeat` at their seat. The finished match
is recorded as an 'arena' match in the same ledger, with its rating update in the same transaction
(`rate_and_record`), so it is on the leaderboard, in both players' histories and replayable with
`ludus arena replay ID` like any other. A person who does not move within the web seat's timeout
forfeits (status 'timeout'), as an agent that does not answer in time does; a game the service
stops before it ends is not recorded.

Match ids: the scheduler reserves the ids of the round it is playing (`Scheduler.reserved_through`),
and a person's game takes the next id past both the ledger's and the reservation, under the
service's write lock.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from typing import Callable

from ludus.agents.human_seat import (GameOver, HumanGame, HumanGames, HumanSeat, HumanSettings, MoveRefused,
                                     StartRequest, check_web_playable)
from ludus.arena.accounts import scheduled_entrants
from ludus.arena.match import SandboxedAgent, play_match
from ludus.arena.store import Entrant, ensure_human, human_id, read_info, verify_copy
from ludus.arena.tournament import (MATCH_KIND, Pairing, TournamentSettings, entrant_agents, entrant_versions,
                                    match_result)
from ludus.league.records.ledger import MatchResult, Store
from ludus.league.records.ratings import ensure_params, load_params, rate_and_record, rebuild_ratings

log = logging.getLogger(__name__)
HUMAN_FORMAT = "human"
"""The ``format`` in a person's match's metadata (the scheduler's are 'ladder')."""


class ArenaHumans:
    """The web seats of one arena service (`ludus.arena.service.ArenaService.humans`)."""

    def __init__(self, arena, settings: HumanSettings, write_lock: threading.Lock, scheduler,
                 on_recorded: Callable[[], None]):
        self.arena = arena
        self.settings = settings
        self.write_lock = write_lock
        self.scheduler = scheduler
        self.on_recorded = on_recorded
        self.games = HumanGames(settings)

    def opponents(self) -> list[str]:
        """The entrants a person may play: the scheduler's (active and not dead)."""
        from ludus.arena.store import ledger_exists

        if not ledger_exists(self.arena.directory):
            return []
        with Store.open(self.arena.directory, mode="read") as store:
            return [e.player_id for e in scheduled_entrants(store)]

    def start(self, account: str, request: StartRequest) -> HumanGame:
        """Seat `account` against the entrant it asked for; the game runs in its own thread."""
        from ludus.games import registry

        arena = self.arena
        game_id = arena.game
        if game_id is None:
            raise MoveRefused("this arena has no game yet: the operator submits entrants first", 409)
        check_web_playable(game_id)
        if request.opponent is None:
            raise MoveRefused('name the entrant to play: {"opponent": "NAME", "seat": 0}')
        with Store.open(arena.directory, mode="read") as store:
            entrant = next((e for e in scheduled_entrants(store) if e.player_id == request.opponent), None)
        if entrant is None:
            raise MoveRefused(f"no entrant {request.opponent!r} to play here (withdrawn, dead or never entered); "
                              f"the play page lists the ones that play", 404)
        verify_copy(entrant, arena.directory, arena.config.sandbox_limits.max_submission_mb << 20)
        spec = registry.spec(game_id)
        players = tuple(human_id(account) if s == request.seat else entrant.player_id for s in range(spec.num_players))
        seed = secrets.randbits(62)

        def play(human: HumanSeat, watch) -> GameOver:
            return self._play(game_id, entrant, account, request.seat, players, seed, human, watch)

        return self.games.start(HumanGame(game_id, request.seat, account, players, play, self.settings))

    def _play(self, game_id: str, entrant: Entrant, account: str, seat: int, players: tuple[str, ...], seed: int,
              human: HumanSeat, watch) -> GameOver:
        """Play the match (in the game's thread), record and rate it; its `GameOver`."""
        from ludus.games import registry

        arena = self.arena
        spec = registry.spec(game_id)
        opponent = entrant_agents(entrant, arena.directory, game_id, spec, arena.config.sandbox_limits,
                                  arena.sandbox_config)[0]
        began = time.time()
        try:
            record = play_match(game_id, [human if s == seat else opponent for s in range(spec.num_players)], seed,
                                arena.config.match_limits, match_id=f"human-{secrets.token_hex(4)}", watch=watch)
        finally:
            if isinstance(opponent, SandboxedAgent):
                opponent.close()
        settings = TournamentSettings(game=game_id, format="ladder", limits=arena.config.match_limits,
                                      stderr_bytes=arena.config.stderr_bytes)
        versions = {**entrant_versions([entrant]), players[seat]: HUMAN_FORMAT}
        draft = match_result(record, Pairing(0, seed, players, 0), spec, versions, began, 0, settings)
        metadata = {k: v for k, v in draft.metadata.items() if k not in ("tournament", "round")}
        metadata.update(format=HUMAN_FORMAT, human_seat=seat)
        with self.write_lock, Store.open(arena.directory, mode="write") as store:
            if read_info(store) is None:
                raise MoveRefused("the arena is gone", 410)
            ensure_human(store, account)  # a member of the board from their first recorded game on
            result: MatchResult = dataclasses.replace(draft, match_id=self.scheduler.next_free_id(store),
                                                      metadata=metadata)
            params = load_params(store) or ensure_params(store, arena.config.trueskill)
            table = rebuild_ratings(store, params, kinds=(MATCH_KIND,))
            rate_and_record(store, table, [result], kinds=(MATCH_KIND,))
        log.info("recorded match %d: %s", result.match_id, " vs ".join(players))
        self.on_recorded()
        return GameOver(tuple(s.episode_return for s in result.seats), tuple(s.status for s in result.seats),
                        tuple(s.error for s in result.seats), result.match_id)

