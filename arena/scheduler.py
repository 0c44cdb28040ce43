"""The arena service's scheduler: rating matches, continuously, until it is told to stop.

Each round it reads the entrants (less the withdrawn and the dead) and the ratings from the ledger,
chooses pairings, plays them in the sandbox on the machine's cores and records every match as
soon as it (and every match scheduled before it) is done:

* **placement first**: an entrant with fewer than `placement_games` games plays before anyone
  else, fewest games first, against opponents drawn by TrueSkill match quality;
* then **the ladder**: `ludus.league.records.matchmaking.schedule_rating_matches` (most uncertain ratings first,
  opponents by match quality), as `ludus arena run --format ladder` does;

each pairing on one seed in both seat (side) orders. Agents' processes live across rounds (one
per seat of a side, `ludus.arena.tournament`); an entrant withdrawn meanwhile has its processes shut down.

Dead entrants: the scheduler's session is one long tournament, so an agent whose fault budget
runs out (`SandboxLimits.max_consecutive_faults`, `max_faults`, `startup_budget_s`) would forfeit
every later match without starting. It is recorded dead in the ledger (`ludus.arena.accounts.mark_dead`)
with the match that killed it, and no later round, nor a restarted service, pairs it again (two
dead entrants used to be paired with each other for thousands of zero-move forfeits: the ladder
favours uncertain ratings, and theirs never settled). The matches already planned in the round
it died in are still played (as forfeits): at most `2 * pairs_per_round`. A new version of its
name is a new entrant and plays.

Crash safety: a match is appended to the ledger with its rating update in one transaction
(`ludus.league.records.ratings.rate_and_record`), and match ids are allocated from the ledger's largest id when
a round is planned. A scheduler killed with SIGKILL loses only the matches that were being
played; restarted, it reads the ratings back from the ledger and plans from there, so no
recorded match is lost or recorded twice. A person's game at the web seat (arena/human.py) may be
recorded while a round plays: it takes an id past the ids the round reserved (`reserved_through`),
and the round rates its next match after it. Writes go through `write_lock` (the service's uploads
write to the same ledger) and hold the ledger's writer lock only for the moment of the write.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ludus.arena.accounts import mark_dead, scheduled_entrants
from ludus.arena.store import count_tournaments, read_info, tournament_key, verify_copy
from ludus.arena.tournament import (MATCH_KIND, Pairing, TournamentSettings, check_two_sides, entrant_agents,
                              entrant_versions, ladder_round, play_in_parallel, play_pairing, seat_players)
from ludus.league.records.ledger import MatchResult, Store
from ludus.league.records.matchmaking import quality_weights
from ludus.league.records.ratings import RatingTable, ensure_params, load_params, rebuild_ratings, rate_and_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerSettings:
    """How the service schedules its rating matches."""

    placement_games: int = 6
    """Games a new entrant plays before the ladder treats it like everyone else."""
    pairs_per_round: int = 2
    """Pairings per round (each played once in each side order)."""
    workers: int | None = None
    """Matches played at once; None: one per core."""
    seed: int = 0
    """Root of the pairing draws and match seeds (a round's stream also depends on the ledger's size)."""
    idle_s: float = 1.0
    """Pause between rounds when there is nothing to play (fewer than two entrants)."""


class Scheduler:
    """Plays rating rounds on an arena (ludus.arena.api.Arena) until `stop` is set."""

    def __init__(self, arena, settings: SchedulerSettings, write_lock: threading.Lock,
                 on_recorded: Callable[[bool], None] = lambda round_done: None):
        self.arena = arena
        self.settings = settings
        self.write_lock = write_lock
        self.on_recorded = on_recorded
        self.players: dict[str, list] = {}
        """Entrant -> its agents (one per seat of a side), started on first use."""
        self.verified: set[str] = set()
        self.session: int | None = None
        self.recorded = 0
        """Matches this scheduler has recorded."""
        self.rounds = 0
        self.reserved_through = -1
        """The largest match id the round being played may use (set under `write_lock`): a match
        recorded by someone else meanwhile (a person's game at the web seat) takes an id past it."""

    def next_free_id(self, store: Store) -> int:
        """A match id for a match recorded outside the rounds (call under `write_lock`)."""
        return max(store.max_match_id(), self.reserved_through) + 1

    # -- the loop

    def run(self, stop: threading.Event) -> None:
        """Rounds until `stop` is set (the round in progress finishes its matches first)."""
        try:
            while not stop.is_set():
                if not self.run_round():
                    stop.wait(self.settings.idle_s)
        finally:
            self.close()

    def run_round(self) -> int:
        """Plan, play and record one round; the number of matches recorded (0: nothing to play)."""
        from ludus.games import registry

        arena = self.arena
        with self.write_lock, Store.open(arena.directory, mode="write") as store:
            info = read_info(store)
            if info is None:
                return 0
            entrants = scheduled_entrants(store)
            max_bytes = arena.config.sandbox_limits.max_submission_mb << 20
            for entrant in entrants:
                if entrant.player_id not in self.verified:
                    verify_copy(entrant, arena.directory, max_bytes)
                    self.verified.add(entrant.player_id)
            params = load_params(store) or ensure_params(store, arena.config.trueskill)
            table = rebuild_ratings(store, params, kinds=(MATCH_KIND,))
            games = {pid: n for pid, (n, _) in store.player_totals().items()}
            next_id = self.next_free_id(store)
            # a round plans at most two matches per pairing (placement or ladder: both side orders)
            self.reserved_through = next_id + 2 * self.settings.pairs_per_round - 1
            seen_seq = store.last_seq()
            if self.session is None:
                self.session = count_tournaments(store) + 1
                store.set_meta(tournament_key(self.session), {
                    "number": self.session, "game": info.game, "format": "service", "seed": self.settings.seed,
                    "started_at": time.time(), "finished": False})
        for pid in [p for p in self.players if p not in {e.player_id for e in entrants}]:
            self._close_agents(pid)  # withdrawn or dead
        if len(entrants) < 2:
            return 0
        spec = registry.spec(info.game)
        check_two_sides(spec)
        # The round's stream: the root seed and the ledger's size, so a restarted scheduler draws anew.
        rng = np.random.default_rng(np.random.SeedSequence([self.settings.seed, next_id]))
        ids = [e.player_id for e in entrants]
        batch = plan_round(rng, table, ids, games, self.settings.placement_games, self.settings.pairs_per_round,
                           next_id, self.rounds, spec.sides)
        assert all(p.match_id <= self.reserved_through for p in batch), "a round planned past its reserved ids"
        settings = TournamentSettings(game=info.game, format="ladder", games_per_pair=2, seed=self.settings.seed,
                                      limits=arena.config.match_limits, stderr_bytes=arena.config.stderr_bytes,
                                      workers=self.settings.workers)
        versions = entrant_versions(entrants)
        by_id = {e.player_id: e for e in entrants}
        for pid in {p for pairing in batch for p in pairing.players}:
            if pid not in self.players:  # started on first use, kept across rounds
                self.players[pid] = entrant_agents(by_id[pid], arena.directory, info.game, spec,
                                                   arena.config.sandbox_limits, arena.sandbox_config)

        def play_one(pairing: Pairing) -> MatchResult:
            return play_pairing(pairing, self.players, spec, versions, self.session, settings)

        recorded = 0
        for result in play_in_parallel(batch, play_one, self.settings.workers or os.cpu_count() or 1):
            deaths = self._deaths(result.player_ids)
            with self.write_lock, Store.open(arena.directory, mode="write") as store:
                if store.last_seq() != seen_seq:  # a person's game was recorded meanwhile: rate after it
                    table = rebuild_ratings(store, params, kinds=(MATCH_KIND,))
                rate_and_record(store, table, [result], kinds=(MATCH_KIND,))
                seen_seq = store.last_seq()
                if deaths:
                    mark_dead(store, deaths)
                    log.warning("the scheduler gave up on %s", "; ".join(f"{p} ({w})" for p, w in deaths.items()))
            recorded += 1
            self.recorded += 1
            self.on_recorded(False)
        self.rounds += 1
        self.on_recorded(True)
        return recorded

    # -- agents

    def _deaths(self, player_ids) -> dict[str, str]:
        """Player id -> why, for those of `player_ids` with an agent whose fault budget ran out."""
        from ludus.arena.match import SandboxedAgent

        deaths = {}
        for pid in dict.fromkeys(player_ids):
            why = next((a.why_dead for a in self.players.get(pid, ()) if isinstance(a, SandboxedAgent) and a.dead),
                       None)
            if why is not None:
                deaths[pid] = why
        return deaths

    def _close_agents(self, player_id: str) -> None:
        from ludus.arena.match import SandboxedAgent

        for agent in self.players.pop(player_id, []):
            if isinstance(agent, SandboxedAgent):
                agent.close()

    def close(self) -> None:
        """Shut every agent down and mark the session finished."""
        for pid in list(self.players):
            self._close_agents(pid)
        if self.session is not None:
            with self.write_lock, Store.open(self.arena.directory, mode="write") as store:
                entry = store.get_meta(tournament_key(self.session), {})
                store.set_meta(tournament_key(self.session), {**entry, "finished": True, "matches": self.recorded,
                                                              "stopped_because": "service stopped"})


def plan_round(rng: np.random.Generator, table: RatingTable, players: list[str], games: dict[str, int],
               placement_games: int, pairs: int, first_match_id: int, round_index: int,
               sides) -> list[Pairing]:
    """One round: placement pairings for entrants short of `placement_games` (fewest first), or
    else a ladder round; each pairing on one seed, in both side orders."""
    newcomers = sorted((p for p in players if games.get(p, 0) < placement_games), key=lambda p: (games.get(p, 0), p))
    if not newcomers:
        return ladder_round(rng, table, players, pairs, 2, first_match_id, round_index, sides)
    batch: list[Pairing] = []
    match_id = first_match_id
    for player in newcomers[:pairs]:
        others = [p for p in players if p != player]
        opponent = others[int(rng.choice(len(others), p=quality_weights(table, player, others)))]
        seed = int(rng.integers(0, 2**63 - 1, endpoint=True))
        for order in ((player, opponent), (opponent, player)):
            batch.append(Pairing(match_id, seed, seat_players(sides, order), round_index))
            match_id += 1
    return batch
