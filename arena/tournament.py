"""Tournaments between sandboxed submissions and built-in bots, recorded in the league's ledger.

Two formats:

* **round-robin**: every pair of entrants plays `games_per_pair` games. The games use common
  random numbers: the tournament seed gives ``games_per_pair / 2`` match seeds shared by every
  pair, and each seed is played twice, once in each seat order, so no pair is luckier with its
  seeds or its seats than another (the variance reduction of paired comparisons). Pairs are
  ordered by the circle method (Berger tables): in each round every entrant plays once.
* **ladder**: rounds of rating games chosen by `ludus.league.records.matchmaking.schedule_rating_matches` (the
  most uncertain TrueSkill ratings first, opponents drawn by match quality, as the league rates
  its pool), each pairing played in both seat orders on one seed, until every entrant's sigma is
  under a threshold (`sigma_converged`) or the game budget is spent.

Each entrant's process is started once per tournament (`SandboxedAgent` lives across matches;
the sandbox restarts it after a fault and gives up on it when a fault or start-up budget runs
out). Matches run in parallel, one per core by default (`play_in_parallel`): each agent plays one
match at a time and meets its matches in schedule order, so results do not depend on timing. Every match is appended to the ledger as kind 'arena' with its moves, think times, each
seat's status (ok | error | timeout | invalid), fault reason and stderr tail, and rated with
TrueSkill by `ludus.league.records.ratings.rate_and_record` in the same transaction.

Team games (two sides of several seats, e.g. ``teams(game=tic_tac_toe)``) are played the same
way: a pairing is two entrants, one per side, and an entrant plays every seat of its side, each
seat by its own sandboxed process (started once per tournament like any agent's), so a
submission written for one seat needs no change; TrueSkill rates the side as one player.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import numpy as np

from ludus.arena.sandbox.isolation import SandboxConfig
from ludus.arena.match import MatchLimits, MatchRecord, SandboxedAgent, make_player, play_match
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.arena.store import ArenaError, Entrant
from ludus.league.records.ledger import MatchResult, SeatResult, Store, outcomes_from_returns
from ludus.league.records.matchmaking import schedule_rating_matches, sigma_converged
from ludus.league.records.ratings import RatingTable, rate_and_record

if TYPE_CHECKING:
    from ludus.agents.policy import Policy
    from ludus.games.core import GameSpec

FORMATS = ("round-robin", "ladder")
MATCH_KIND = "arena"
_MAX_SEED = 2**63 - 1
_SEED_STREAM, _LADDER_STREAM = 0, 1  # independent SeedSequence streams of one tournament seed


@dataclass(frozen=True)
class TournamentSettings:
    """What one tournament plays."""

    game: str
    """Registry id of the game."""
    format: str
    """'round-robin' or 'ladder'."""
    games_per_pair: int = 2
    """Games per pairing, an even number: half the seeds, each played in both seat orders."""
    seed: int = 0
    """Seed of the whole tournament (match seeds and the ladder's draws derive from it)."""
    limits: MatchLimits = MatchLimits()
    """Time control of every match."""
    sigma_threshold: float = 2.0
    """Ladder: stop when every entrant's TrueSkill sigma is at most this."""
    max_games: int = 400
    """Ladder: stop after this many games in any case."""
    pairs_per_round: int | None = None
    """Ladder: pairings scheduled between rating updates; None: half the number of entrants."""
    stderr_bytes: int = 4096
    """The last bytes of a seat's stderr kept in the ledger (seat metadata 'stderr')."""
    workers: int | None = None
    """Matches played at once (each agent in one at a time); None: one per core of the machine.
    Each agent's CPU quota (`SandboxLimits.cpu_cores`) keeps parallel matches from taking each
    other's move time."""

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ArenaError(f"workers must be at least 1, got {self.workers}")
        if self.format not in FORMATS:
            raise ArenaError(f"unknown tournament format {self.format!r}; use one of {', '.join(FORMATS)}")
        if self.games_per_pair < 2 or self.games_per_pair % 2:
            raise ArenaError(f"games_per_pair must be an even number >= 2 (each seed is played in both seat "
                             f"orders), got {self.games_per_pair}")
        if not 0 <= self.seed <= _MAX_SEED:
            raise ArenaError(f"the tournament seed must be in [0, 2**63), got {self.seed}")
        if not self.sigma_threshold > 0 or self.max_games < 1:
            raise ArenaError(f"the ladder needs sigma_threshold > 0 and max_games >= 1, got "
                             f"{self.sigma_threshold} and {self.max_games}")


@dataclass(frozen=True)
class Pairing:
    """One scheduled match."""

    match_id: int
    seed: int
    players: tuple[str, ...]
    """Player id per seat (in a team game, an entrant's id on every seat of its side)."""
    round: int
    """Round of the schedule (matches of a round are recorded and rated together)."""


@dataclass(frozen=True)
class MatchSummary:
    """A played match, as the tournament report lists it."""

    match_id: int
    players: tuple[str, ...]
    returns: tuple[float, ...]
    statuses: tuple[str, ...]
    """'ok', 'error', 'timeout' or 'invalid' per seat."""
    reasons: tuple[str, ...]
    """Fault reason per seat ('' for ok seats)."""
    moves: int
    duration_s: float


@dataclass(frozen=True)
class EntrantReport:
    """How one entrant fared in a tournament."""

    player_id: str
    games: int
    wins: int
    draws: int
    losses: int
    faults: Mapping[str, int]
    """Forfeited games by status ('error', 'timeout', 'invalid')."""
    process_starts: int
    """How often its process was started (1 for a healthy agent; 0 for an in-process bot)."""
    dead: bool
    """Given up on after too many faulty matches in a row."""
    leftover_pids: tuple[int, ...] = ()
    """Processes of it that survived the end of the tournament (always empty unless the sandbox failed)."""


@dataclass(frozen=True)
class TournamentReport:
    """The outcome of `play_tournament`."""

    number: int
    """Tournament number in this arena (1, 2, ...)."""
    settings: TournamentSettings
    matches: tuple[MatchSummary, ...]
    entrants: tuple[EntrantReport, ...]
    started_at: float
    duration_s: float
    stopped_because: str
    """'schedule complete', 'sigma converged' or 'game budget spent'."""
    final_sigma: Mapping[str, float] = field(default_factory=dict)
    """Each entrant's TrueSkill sigma after the tournament."""

    def entrant(self, player_id: str) -> EntrantReport:
        for e in self.entrants:
            if e.player_id == player_id:
                return e
        raise KeyError(player_id)


# ------------------------------------------------------------------------------------ scheduling


def match_seeds(seed: int, stream: int, n: int) -> list[int]:
    """`n` match seeds in [0, 2**63) from a tournament seed (independent per stream)."""
    state = np.random.SeedSequence([seed, stream]).generate_state(n, np.uint64)
    return [int(s >> np.uint64(1)) for s in state]


def circle_rounds(players: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Round-robin rounds by the circle method: n-1 rounds (n rounds when n is odd, one bye each)
    in which every entrant plays at most once; every pair meets exactly once."""
    ring: list[str | None] = list(players) + ([None] if len(players) % 2 else [])
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1]] + ring[1:-1]  # keep the first fixed, rotate the rest
    return rounds


def seat_players(sides: Sequence[Sequence[int]], entrants: Sequence[str]) -> tuple[str, ...]:
    """Player id per seat when entrant k plays every seat of side k."""
    seats = {seat: player for side, player in zip(sides, entrants) for seat in side}
    return tuple(seats[s] for s in range(len(seats)))


TWO_SEATS = ((0,), (1,))
"""The sides of a two-player game: one seat each."""


def round_robin_schedule(players: Sequence[str], games_per_pair: int, seed: int,
                         first_match_id: int, sides: Sequence[Sequence[int]] = TWO_SEATS) -> list[list[Pairing]]:
    """Rounds of pairings: for each of the ``games_per_pair / 2`` shared seeds, every circle round,
    each pair playing that seed in both side orders back to back."""
    seeds = match_seeds(seed, _SEED_STREAM, games_per_pair // 2)
    schedule: list[list[Pairing]] = []
    match_id = first_match_id
    for match_seed in seeds:
        for pairs in circle_rounds(players):
            batch = []
            for a, b in pairs:
                for order in ((a, b), (b, a)):
                    batch.append(Pairing(match_id, match_seed, seat_players(sides, order), len(schedule)))
                    match_id += 1
            schedule.append(batch)
    return [batch for batch in schedule if batch]


def ladder_round(rng: np.random.Generator, table: RatingTable, players: Sequence[str], pairs: int,
                 games_per_pair: int, first_match_id: int, round_index: int,
                 sides: Sequence[Sequence[int]] = TWO_SEATS) -> list[Pairing]:
    """One ladder round: `pairs` pairings by rating uncertainty and match quality, each played
    ``games_per_pair / 2`` seeds times in both side orders."""
    batch = []
    match_id = first_match_id
    for a, b in schedule_rating_matches(rng, table, players, pairs):
        for match_seed in rng.integers(0, _MAX_SEED, size=games_per_pair // 2, endpoint=True).tolist():
            for order in ((a, b), (b, a)):
                batch.append(Pairing(match_id, int(match_seed), seat_players(sides, order), round_index))
                match_id += 1
    return batch


# -------------------------------------------------------------------------------------- recording


def match_result(record: MatchRecord, pairing: Pairing, spec: "GameSpec", versions: Mapping[str, str],
                 started_at: float, tournament: int, settings: TournamentSettings) -> MatchResult:
    """The ledger row of a played match. A faulting seat scores outcome 0 (it forfeited); the
    others score by their returns (`forfeit_returns` already made the opponent the winner)."""
    teams = spec.team_of_seat
    outcomes = outcomes_from_returns(record.returns, teams)
    seats = []
    for s, player_id in enumerate(pairing.players):
        fault = record.faults[s]
        extras: dict[str, object] = {"think_s": round(record.think_s[s], 4)}
        tail = record.stderr_tails[s]
        if tail:
            extras["stderr"] = tail[-settings.stderr_bytes:]
        if fault is not None and fault.exit_code is not None:
            extras["exit_code"] = fault.exit_code
        if record.text is not None:  # the moves the game judged invalid
            extras["invalid"] = int(record.text.invalid[s])
        seats.append(SeatResult(
            seat=s, team=teams[s], player_id=player_id, episode_return=float(record.returns[s]),
            outcome=0.0 if fault is not None else outcomes[s], player_version=versions[player_id],
            status=record.statuses[s].value, error=fault.reason if fault is not None else "", metadata=extras))
    metadata = {"think_ms": [round(m.think_s * 1000, 2) for m in record.moves], "forfeit": record.forfeit,
                "tournament": tournament, "format": settings.format, "round": pairing.round,
                "time_per_move_s": settings.limits.time_per_move_s, "overage_s": settings.limits.overage_s}
    if record.text is not None:  # a text-move game: every move's text replays it
        metadata["texts"] = list(record.text.texts)
    return MatchResult(match_id=pairing.match_id, kind=MATCH_KIND, game_id=settings.game, seed=pairing.seed,
                       seats=tuple(seats), length=len(record.moves), started_at=started_at,
                       duration_s=record.duration_s, metadata=metadata,
                       moves=tuple(m.action for m in record.moves), truncated=record.truncated)


def summarize(result: MatchResult) -> MatchSummary:
    return MatchSummary(result.match_id, result.player_ids, tuple(s.episode_return for s in result.seats),
                        tuple(s.status for s in result.seats), tuple(s.error for s in result.seats),
                        result.length, result.duration_s)


# ---------------------------------------------------------------------------------------- playing


def play_in_parallel(batch: Sequence[Pairing], play: Callable[[Pairing], MatchResult],
                     workers: int) -> Iterator[MatchResult]:
    """Play `batch` with up to `workers` matches at once; yields the results in the batch's order,
    each as soon as it and all before it are done.

    An agent is one process and plays one match at a time, and it meets its matches in the order
    of the schedule, whatever the timing: a pairing starts only when no earlier unfinished pairing
    involves either of its players. So the ledger and every agent's sequence of matches are those
    of the serial schedule. Matches wait on their agents' pipes (threads suffice); agents run in
    their own processes on the machine's cores."""
    if workers <= 1 or len(batch) <= 1:
        yield from (play(pairing) for pairing in batch)
        return
    results: dict[int, MatchResult] = {}
    pending = list(range(len(batch)))
    running: dict[Future, int] = {}
    next_out = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ludus-match") as pool:
        while pending or running:
            busy = {p for i in running.values() for p in batch[i].players}
            blocked: set[str] = set()
            for i in list(pending):
                players = set(batch[i].players)
                if len(running) < workers and not players & (busy | blocked):
                    running[pool.submit(play, batch[i])] = i
                    busy |= players
                    pending.remove(i)
                blocked |= players  # later pairings of these players wait for this one
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = future.result()
            while next_out in results:
                yield results.pop(next_out)
                next_out += 1


def _entrant_reports(entrants: Sequence[Entrant], players: Mapping[str, Sequence["SandboxedAgent | Policy"]],
                     results: Sequence[MatchResult],
                     leftovers: Mapping[str, tuple[int, ...]]) -> tuple[EntrantReport, ...]:
    reports = []
    for entrant in entrants:
        pid = entrant.player_id
        games = wins = draws = losses = 0
        faults: dict[str, int] = {}
        for result in results:
            seats = [seat for seat in result.seats if seat.player_id == pid]
            if not seats:
                continue
            games += 1  # a team entrant's seats share one outcome: one game
            wins += seats[0].outcome == 1.0
            draws += seats[0].outcome == 0.5
            losses += seats[0].outcome == 0.0
            for status in {seat.status for seat in seats if seat.status != "ok"}:
                faults[status] = faults.get(status, 0) + 1
        agents = [a for a in players.get(pid, ()) if isinstance(a, SandboxedAgent)]
        reports.append(EntrantReport(pid, games, wins, draws, losses, faults, sum(a.starts for a in agents),
                                     any(a.dead for a in agents), leftovers.get(pid, ())))
    return tuple(reports)


def entrant_versions(entrants: Sequence[Entrant]) -> dict[str, str]:
    """The version each entrant's seats record in the ledger: a submission's digest prefix, a bot's name."""
    return {e.player_id: e.digest[:12] if e.kind == "submission" else e.digest for e in entrants}


def entrant_agents(entrant: Entrant, arena_dir: Path, game: str, spec: "GameSpec", sandbox_limits: SandboxLimits,
                   sandbox_config: SandboxConfig) -> list["SandboxedAgent | Policy"]:
    """What plays an entrant: one agent per seat of the game's largest side (a team entrant plays
    every seat of its side, each seat its own sandboxed process)."""
    return [make_player(entrant.submission(arena_dir), game, sandbox_limits, sandbox_config)
            for _ in range(max(map(len, spec.sides)))]


def play_pairing(pairing: Pairing, players: Mapping[str, Sequence["SandboxedAgent | Policy"]], spec: "GameSpec",
                 versions: Mapping[str, str], tournament: int, settings: TournamentSettings) -> MatchResult:
    """Play one scheduled match and return its ledger row: the k-th seat of an entrant's side is
    played by its k-th agent (`entrant_agents`)."""
    begun = time.time()
    taken = {p: 0 for p in pairing.players}
    agents = []
    for p in pairing.players:
        agents.append(players[p][taken[p]])
        taken[p] += 1
    record = play_match(settings.game, agents, pairing.seed, settings.limits, match_id=str(pairing.match_id))
    return match_result(record, pairing, spec, versions, begun, tournament, settings)


def check_two_sides(spec: "GameSpec") -> None:
    """Refuse a game that is not played between two sides (two players, or two teams of seats)."""
    if len(spec.sides) != 2:
        raise ArenaError(f"the arena runs games between two sides (two players or two teams); {spec.id!r} has "
                         f"{len(spec.sides)} sides")


def play_tournament(store: Store, arena_dir: Path, entrants: Sequence[Entrant], table: RatingTable,
                    settings: TournamentSettings, number: int, sandbox_limits: SandboxLimits,
                    sandbox_config: SandboxConfig,
                    progress: Callable[[str], None] | None = None) -> TournamentReport:
    """Play a tournament among `entrants`, appending every match to `store` (opened for writing)
    and rating it into `table` (the arena's current ratings) as it goes.

    Matches are recorded and rated one schedule round at a time, each round in one transaction,
    so an interrupted tournament leaves whole rounds in the ledger and the ratings consistent
    with them. Every sandboxed process is shut down and verified gone before this returns.
    """
    from ludus.games import registry

    spec = registry.spec(settings.game)
    check_two_sides(spec)
    if len(entrants) < 2:
        raise ArenaError(f"a tournament needs at least two entrants, the arena has {len(entrants)}: "
                         f"submit more with `ludus arena submit`")
    ids = [e.player_id for e in entrants]
    versions = entrant_versions(entrants)
    started_at = time.time()
    clock = time.monotonic()
    results: list[MatchResult] = []
    # An entrant's agents: one per seat of the largest side (a team entrant plays every seat of its side).
    players: dict[str, list[SandboxedAgent | Policy]] = {}
    leftovers: dict[str, tuple[int, ...]] = {}
    stopped = "schedule complete"
    sides = spec.sides
    try:
        for entrant in entrants:
            players[entrant.player_id] = entrant_agents(entrant, arena_dir, settings.game, spec, sandbox_limits,
                                                        sandbox_config)

        def play_one(pairing: Pairing) -> MatchResult:
            return play_pairing(pairing, players, spec, versions, number, settings)

        workers = settings.workers or os.cpu_count() or 1

        def record_round(played: list[MatchResult]) -> None:
            rate_and_record(store, table, played, kinds=(MATCH_KIND,))
            results.extend(played)
            if progress is not None:
                forfeits = sum(r.metadata["forfeit"] for r in played)
                progress(f"round {played[0].metadata['round'] + 1}: {len(played)} matches, {forfeits} forfeits "
                         f"({time.monotonic() - clock:.1f} s)")

        first_id = store.max_match_id() + 1
        if settings.format == "round-robin":
            # the whole schedule is known in advance: play it as one stream (no idle core at the end
            # of a round) and record each round, in order, as soon as its last match is in
            rounds = round_robin_schedule(ids, settings.games_per_pair, settings.seed, first_id, sides)
            stream = play_in_parallel([p for batch in rounds for p in batch], play_one, workers)
            for batch in rounds:
                record_round([next(stream) for _ in batch])
        else:
            rng = np.random.default_rng(np.random.SeedSequence([settings.seed, _LADDER_STREAM]))
            pairs_per_round = settings.pairs_per_round or max(1, len(ids) // 2)
            round_index = 0
            while True:
                if sigma_converged(table, ids, settings.sigma_threshold):
                    stopped = "sigma converged"
                    break
                room = (settings.max_games - len(results)) // settings.games_per_pair
                if room < 1:
                    stopped = "game budget spent"
                    break
                batch = ladder_round(rng, table, ids, min(pairs_per_round, room), settings.games_per_pair,
                                     first_id + len(results), round_index, sides)
                record_round(list(play_in_parallel(batch, play_one, workers)))  # the next round needs these ratings
                round_index += 1
    finally:
        for pid, agents in players.items():
            for player in agents:
                if isinstance(player, SandboxedAgent):
                    player.close()
                    if player.leftover_pids:
                        leftovers[pid] = leftovers.get(pid, ()) + player.leftover_pids
    sigma = table.arrays(ids)[1]
    return TournamentReport(number, settings, tuple(summarize(r) for r in results),
                            _entrant_reports(entrants, players, results, leftovers), started_at,
                            time.monotonic() - clock, stopped, dict(zip(ids, sigma.tolist())))


def format_report(report: TournamentReport) -> str:
    """The tournament as text for people: settings, then one line per entrant."""
    s = report.settings
    forfeits = sum(any(st != "ok" for st in m.statuses) for m in report.matches)
    lines = [f"tournament {report.number}: {s.format} on {s.game}, seed {s.seed}, {len(report.matches)} matches "
             f"({forfeits} forfeited) in {report.duration_s:.1f} s; stopped: {report.stopped_because}",
             f"  {'entrant':<24} {'games':>5} {'W':>4} {'D':>4} {'L':>4} {'starts':>6}  faults"]
    for e in report.entrants:
        faults = ", ".join(f"{n} {status}" for status, n in sorted(e.faults.items())) or "-"
        if e.dead:
            faults += " (dead)"
        if e.leftover_pids:
            faults += f" LEFTOVER PROCESSES {list(e.leftover_pids)}"
        lines.append(f"  {e.player_id[:24]:<24} {e.games:>5} {e.wins:>4} {e.draws:>4} {e.losses:>4} "
                     f"{e.process_starts:>6}  {faults}")
    return "\n".join(lines)
