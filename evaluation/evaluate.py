"""A checkpoint against a run's frozen population: W/D/L with Wilson intervals and a TrueSkill placement.

`evaluate_checkpoint` plays a snapshot directory against every frozen member of a run (its
snapshots, and its anchor bots when asked) on the league's own runners, then

* counts wins, draws and losses per opponent, with Wilson 95% score intervals (league/stats.py;
  a draw counts half a win);
* fits the checkpoint's TrueSkill rating against the opponents' stored ratings, which stay fixed
  (`ludus.league.records.ratings.fit_placement`: expectation propagation on the newcomer's skill only), and
  ranks it among the run's rated members by the conservative skill mu - 3 sigma;
* places it by Bradley-Terry too (`ludus.league.records.ranking`): one fit, with 95% bootstrap intervals of
  the rating and the rank, on the games between the run's frozen members in its ledger (the
  matches `ludus ratings` reads) plus the evaluation games, ties as half wins. Unlike the
  TrueSkill placement the members' ratings move with the new games; the intervals say how sure
  the place is.

Seating and seeds. Every game seed is played once with the checkpoint in each seat and the
opponent in the others ("duplicate" play, as in duplicate bridge and poker AI evaluations): in
games with chance the same deal is played from both sides, which removes most of the luck from
the score; in deterministic games it balances the first-move advantage. The same seeds are used
against every opponent (common random numbers), so differences between opponents are not
differences in deals. The Wilson interval treats games as independent; the two games of a pair
share a deal that favours one seat as much as it hurts the other, which lowers the variance of
their mean, so the intervals are, if anything, conservative.

Greedy or sampling. By default every player samples from its policy, as it was trained and as the
league plays it: a deterministic (greedy) policy in a deterministic game plays the same game
from each seat every time, so N games would measure only 2 (`--greedy` is there for stochastic
games or to score the argmax policy; anchors behave the same either way).

The run directory is only read (`Store.open(mode="read")`, atomic JSON files), so this works
while the run trains.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from ludus.agents.mixture import component_paths, is_mixture, read_mixture
from ludus.agents.policy import Policy
from ludus.agents.threads import torch_threads
from ludus.games.mix import match_game_id, mix_parts
from ludus.league.records.ledger import outcomes_from_returns
from ludus.league.records.population import Member
from ludus.league.records.ratings import Rating, fit_placement
from ludus.league.play.runner import MatchAssignment, PlayedMatch, PlayTask
from ludus.league.stats import wilson_interval
from ludus.errors import UserError

CANDIDATE = "candidate"
"""Player id of the evaluated policy in `evaluate_policies` (opponents may not use it)."""

BACKENDS = ("serial", "process")


class EvaluationError(UserError):
    """An evaluation that cannot run as asked (bad game count, single-player game, ...)."""


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class OpponentResult:
    """The evaluated player's results against one opponent."""

    opponent: str
    """The opponent's player id."""
    kind: str
    """'snapshot', 'anchor' or 'policy' (an in-memory policy of `evaluate_policies`)."""
    games: int
    wins: int
    draws: int
    losses: int
    """Games won, drawn (or placed between first and last in games of more than two teams) and lost."""
    score: float
    """Mean outcome of the evaluated player: 1 win, 0.5 draw, 0 loss (rank-based for > 2 teams)."""
    lower: float
    upper: float
    """Wilson 95% interval of the score."""
    mean_return: float
    """Mean final return of the evaluated player's seat."""
    seat_scores: tuple[float, ...]
    """Score per seat the evaluated player sat in (seat 0 first)."""
    opponent_mu: float | None = None
    opponent_sigma: float | None = None
    """The opponent's stored TrueSkill rating (None when it has none yet)."""

    @property
    def interval(self) -> tuple[float, float]:
        return self.lower, self.upper


@dataclass(frozen=True)
class GameResults:
    """A run of several games: the evaluation's games of one of them (each game a seed drew)."""

    game: str
    opponents: tuple[OpponentResult, ...]
    total_games: int
    score: float
    lower: float
    upper: float
    """Wilson 95% interval of `score`."""


@dataclass(frozen=True)
class EvaluationReport:
    """What `evaluate_checkpoint` found."""

    checkpoint: str
    """Path of the evaluated snapshot directory."""
    snapshot_id: str
    """Its content hash."""
    game_id: str
    run_dir: str
    run_iteration: int
    """The run's iteration when its population was read."""
    games_per_opponent: int
    """Games actually played per opponent (the request rounded up to whole seat rotations)."""
    greedy: bool
    seed: int
    opponents: tuple[OpponentResult, ...]
    total_games: int
    score: float
    """Mean outcome over all games."""
    lower: float
    upper: float
    """Wilson 95% interval of `score`."""
    placement_mu: float | None
    placement_sigma: float | None
    """The checkpoint's TrueSkill rating fitted against the opponents' frozen ratings; None when
    none of its opponents is rated yet."""
    placement_games: int
    """Games against rated opponents that the placement used."""
    rank: int | None
    """1-based rank of the placement among the run's rated members by mu - 3 sigma (1 = best)."""
    rated_members: int
    """Number of rated members it was ranked among."""
    seconds: float
    bt_rating: float | None = None
    """Bradley-Terry rating of the checkpoint (Elo-like scale, mean 1000 over the players fitted)."""
    bt_low: float | None = None
    bt_high: float | None = None
    """Its 95% bootstrap interval."""
    bt_rank: int | None = None
    bt_rank_low: int | None = None
    bt_rank_high: int | None = None
    """Its place among `bt_players` (1 = best) and the place's 95% bootstrap interval."""
    bt_players: int = 0
    """Players in the fit: the checkpoint and the frozen members with games."""
    bt_games: int = 0
    """Games in the fit: the ledger's games between frozen members plus the evaluation games."""
    by_game: tuple[GameResults, ...] = ()
    """A run of several games (games/mix.py): the same games split by the game each played."""

    @property
    def placement(self) -> Rating | None:
        if self.placement_mu is None or self.placement_sigma is None:
            return None
        return Rating(self.placement_mu, self.placement_sigma)

    def to_json(self) -> dict:
        data = asdict(self)
        data["placement_conservative"] = (None if self.placement is None else self.placement.conservative)
        return data


# ---------------------------------------------------------------------------------------------
# Seating, seeds and tallies


def pair_seed(seed: int, pair: int) -> int:
    """The game seed of the pair-th seat rotation: a SeedSequence child, in [0, 2**63)."""
    state = np.random.SeedSequence(seed, spawn_key=(pair,)).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def rotations_for(games: int, num_sides: int) -> int:
    """Side rotations (seeds) needed for at least `games` games: each seed is played once per side."""
    return -(-games // num_sides)


def paired_assignments(candidate: str, opponents: Sequence[str], games_per_opponent: int, num_players: int,
                       seed: int, kind: str = "evaluation",
                       sides: Sequence[Sequence[int]] | None = None) -> list[MatchAssignment]:
    """Matches of `candidate` against each opponent: every seed once with the candidate on each side
    and the opponent on all others; the same seeds for every opponent. `sides`: the seats each
    player fills (`GameSpec.sides`: a team's seats in team games); one seat each by default.

    Match ids run 0, 1, ... in the returned order (they only need to be unique within one play).
    """
    sides = [tuple(side) for side in sides] if sides is not None else [(seat,) for seat in range(num_players)]
    if len(sides) < 2:
        raise EvaluationError("evaluation against opponents needs a game of two or more sides")
    if games_per_opponent < 1:
        raise EvaluationError(f"games per opponent must be >= 1, got {games_per_opponent}")
    if candidate in opponents:
        raise EvaluationError(f"opponent id {candidate!r} collides with the evaluated player's id")
    seeds = [pair_seed(seed, k) for k in range(rotations_for(games_per_opponent, len(sides)))]
    assignments = []
    for opponent in opponents:
        for game_seed in seeds:
            for side in sides:
                players = tuple(candidate if s in side else opponent for s in range(num_players))
                assignments.append(MatchAssignment(len(assignments), game_seed, players, kind))
    return assignments


@dataclass
class _Tally:
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    score_sum: float = 0.0
    return_sum: float = 0.0
    seat_sum: dict[int, float] = field(default_factory=dict)
    seat_games: dict[int, int] = field(default_factory=dict)


def _candidate_seat(match: PlayedMatch, candidate: str) -> int:
    return match.assignment.players.index(candidate)


def tally_matches(matches: Iterable[PlayedMatch], candidate: str, teams: Sequence[int],
                  kinds: Mapping[str, str] | None = None,
                  ratings: Mapping[str, Rating] | None = None) -> tuple[OpponentResult, ...]:
    """Per-opponent W/D/L, score, Wilson interval and seat split of `candidate` over played matches."""
    tallies: dict[str, _Tally] = {}
    for match in matches:
        seat = _candidate_seat(match, candidate)
        opponent = next(p for p in match.assignment.players if p != candidate)
        outcome = outcomes_from_returns(match.returns, teams)[seat]
        t = tallies.setdefault(opponent, _Tally())
        t.games += 1
        t.wins += outcome == 1.0
        t.losses += outcome == 0.0
        t.draws += 0.0 < outcome < 1.0
        t.score_sum += outcome
        t.return_sum += match.returns[seat]
        t.seat_sum[seat] = t.seat_sum.get(seat, 0.0) + outcome
        t.seat_games[seat] = t.seat_games.get(seat, 0) + 1
    results = []
    for opponent, t in tallies.items():
        lower, upper = wilson_interval(t.score_sum, t.games)
        rating = (ratings or {}).get(opponent)
        results.append(OpponentResult(
            opponent=opponent, kind=(kinds or {}).get(opponent, "policy"), games=t.games, wins=t.wins,
            draws=t.draws, losses=t.losses, score=t.score_sum / t.games, lower=lower, upper=upper,
            mean_return=t.return_sum / t.games,
            seat_scores=tuple(t.seat_sum[s] / t.seat_games[s] for s in sorted(t.seat_sum)),
            opponent_mu=None if rating is None else rating.mu,
            opponent_sigma=None if rating is None else rating.sigma))
    return tuple(results)


def placement_games(matches: Iterable[PlayedMatch], candidate: str, teams: Sequence[int]) -> list[tuple[str, float]]:
    """(opponent, candidate's outcome) per pair of seats on different teams, for `fit_placement`.

    In a two-player game that is one entry per game; with more teams the candidate's team is
    compared with each other team (1 if its mean return is higher, 0.5 if equal, 0 if lower)."""
    games = []
    for match in matches:
        seat = _candidate_seat(match, candidate)
        compared: set[int] = set()  # one comparison per opposing team (a team of two is one opponent)
        for other, player in enumerate(match.assignment.players):
            if other == seat or teams[other] == teams[seat] or player == candidate or teams[other] in compared:
                continue
            compared.add(teams[other])
            mine = np.mean([r for s, r in enumerate(match.returns) if teams[s] == teams[seat]])
            theirs = np.mean([r for s, r in enumerate(match.returns) if teams[s] == teams[other]])
            games.append((player, 1.0 if mine > theirs else 0.0 if mine < theirs else 0.5))
    return games


def overall(results: Sequence[OpponentResult]) -> tuple[int, float, float, float]:
    """(games, score, lower, upper) pooled over opponents."""
    games = sum(r.games for r in results)
    if games == 0:
        return 0, math.nan, 0.0, 1.0
    score_sum = sum(r.score * r.games for r in results)
    lower, upper = wilson_interval(score_sum, games)
    return games, score_sum / games, lower, upper


# ---------------------------------------------------------------------------------------------
# In-memory policies (bots, probes, tests)


def play_assignments(game_id: str, assignments: Sequence[MatchAssignment], policies: Mapping[str, Policy],
                     sample_seed: int, greedy: Sequence[str] = (), num_envs: int = 64,
                     threads: int = 1) -> tuple[PlayedMatch, ...]:
    """Play matches in this process on one league `Runner` (batched across games and seats), torch
    on `threads` threads."""
    from ludus.league.play.backends import make_runner

    runner = make_runner(game_id, max(1, min(num_envs, len(assignments))), sample_seed)
    task = PlayTask(task_id=0, assignments=tuple(assignments), sample_seed=sample_seed, greedy=tuple(greedy))
    with torch_threads(threads):
        return tuple(runner.play(task, policies.__getitem__).matches)


def evaluate_policies(game_id: str, candidate: Policy, opponents: Mapping[str, Policy], games_per_opponent: int,
                      seed: int = 0, greedy: bool = False, num_envs: int = 64,
                      threads: int = 1) -> tuple[OpponentResult, ...]:
    """`candidate` against each named opponent policy, duplicate-seated as `evaluate_checkpoint` does.

    `greedy` makes the candidate and the opponents act greedily (bots ignore it); torch runs on
    `threads` threads.
    """
    from ludus.games.registry import spec as game_spec

    matches = policy_matches(game_id, candidate, opponents, games_per_opponent, seed, greedy, num_envs, threads)
    return tally_matches(matches, CANDIDATE, game_spec(game_id).team_of_seat)


def policy_matches(game_id: str, candidate: Policy, opponents: Mapping[str, Policy], games_per_opponent: int,
                   seed: int = 0, greedy: bool = False, num_envs: int = 64,
                   threads: int = 1) -> tuple[PlayedMatch, ...]:
    """The matches `evaluate_policies` plays (the candidate's player id is `CANDIDATE`), for a
    caller that reads more of them than the tally (e.g. the invalid moves of text games)."""
    from ludus.games.registry import spec as game_spec

    spec = game_spec(game_id)
    assignments = paired_assignments(CANDIDATE, list(opponents), games_per_opponent, spec.num_players, seed,
                                     sides=spec.sides)
    policies = {CANDIDATE: candidate, **opponents}
    return play_assignments(game_id, assignments, policies, sample_seed=pair_seed(seed, 1 << 30),
                            greedy=tuple(policies) if greedy else (), num_envs=num_envs, threads=threads)


# ---------------------------------------------------------------------------------------------
# A checkpoint against a run


def _shard(assignments: list[MatchAssignment], shards: int, seed: int, greedy: tuple[str, ...]) -> list[PlayTask]:
    bounds = np.linspace(0, len(assignments), shards + 1).astype(int)
    return [PlayTask(task_id=i, assignments=tuple(assignments[bounds[i]:bounds[i + 1]]),
                     sample_seed=pair_seed(seed, (1 << 30) + i), greedy=greedy)
            for i in range(shards) if bounds[i + 1] > bounds[i]]


def same_game(checkpoint_game: str, run_game: str, run_spec) -> bool:
    """Whether a checkpoint's game id names the run's game: the ids as written, or as the registry
    spells them (a config's `spiel:kuhn_poker( players=2 )` and a snapshot's spec id
    `spiel:kuhn_poker(players=2)` name one game)."""
    from ludus.games.core import GameError
    from ludus.games.registry import spec as game_spec

    if checkpoint_game in (run_game, run_spec.id):
        return True
    try:
        return game_spec(checkpoint_game).id == run_spec.id
    except GameError:
        return False


def evaluate_checkpoint(checkpoint_path: str | os.PathLike, run_dir: str | os.PathLike, games_per_opponent: int = 100,
                        include_anchors: bool = False, seed: int = 0, num_runners: int = 1, backend: str = "serial",
                        greedy: bool = False, num_envs: int = 64) -> EvaluationReport:
    """Play a snapshot against every frozen member of a run and place it among them.

    Args:
        checkpoint_path: a snapshot directory (agents/snapshot.py format) of the run's game; a
            corrupt snapshot or one of another game raises `SnapshotError` (a one-line UserError).
        run_dir: the league run; only read.
        games_per_opponent: games against each opponent, rounded up to a multiple of the number of
            seats (each seed is played once from every seat).
        include_anchors: also play the run's anchor bots (and use their ratings in the placement).
        seed: seeds the game seeds and the action sampling; the same seed gives the same report.
        num_runners: runner shards; with backend 'process' they run in parallel worker processes.
        backend: 'serial' (this process) or 'process'; both give identical results for a given
            num_runners.
        greedy: the checkpoint and the snapshot opponents act greedily instead of sampling.
        num_envs: games each runner steps at once.
    """
    from ludus.agents.snapshot import verify_snapshot
    from ludus.league.config import config_from_dict
    from ludus.league.learners.learning import make_learner_architecture
    from ludus.games.registry import spec as game_spec
    from ludus.league.api import stored_ratings
    from ludus.league.play.backends import ProcessBackend, SerialBackend
    from ludus.league.checkpoint import check_member_snapshots
    from ludus.league.rundata import open_ledger, read_run, trueskill_params

    start = time.perf_counter()
    if backend not in BACKENDS:
        raise EvaluationError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if num_runners < 1:
        raise EvaluationError(f"num_runners must be >= 1, got {num_runners}")
    run = read_run(run_dir)
    spec = game_spec(run.game_id)
    checkpoint_path = Path(checkpoint_path).resolve()
    # Verify here, in this process: a bad checkpoint is a one-line SnapshotError, not a worker crash.
    if is_mixture(checkpoint_path):
        mixture = read_mixture(checkpoint_path)
        if not same_game(mixture.game_id, run.game_id, spec):
            raise EvaluationError(f"{checkpoint_path} plays {mixture.game_id}, the run {run.game_id}")
        candidate_id, snapshot_id = "eval:mixture", "mixture"
        components = _mixture_members(checkpoint_path, mixture)
        weights = [c.weight for c in mixture.components]
    else:
        ref = verify_snapshot(checkpoint_path)
        if not same_game(ref.game_id, run.game_id, spec):
            raise EvaluationError(f"{checkpoint_path} plays {ref.game_id}, the run {run.game_id}")
        candidate_id, snapshot_id = f"eval:{ref.snapshot_id[:12]}", ref.snapshot_id
        components = [Member(candidate_id, "snapshot", "evaluated", snapshot_path=str(checkpoint_path),
                             snapshot_id=snapshot_id)]
        weights = None
    opponents = run.frozen(include_anchors)
    check_member_snapshots(run.run_dir, opponents)  # as `ludus resume` does: no swapped snapshot plays
    if not opponents:
        raise EvaluationError(f"run {run.run_dir} has no frozen members to play"
                              f"{'' if include_anchors else ' (add --anchors to play its anchor bots)'}")
    assignments = paired_assignments(candidate_id, [m.player_id for m in opponents], games_per_opponent,
                                     spec.num_players, seed, sides=spec.sides)
    if weights is not None:  # a mixture: its components take turns
        assignments = _draw_components(assignments, candidate_id, components, weights, seed)
    component_ids = {m.player_id for m in components}
    greedy_players = (tuple(sorted(component_ids)) + tuple(m.player_id for m in opponents if m.kind == "snapshot")
                      if greedy else ())
    tasks = _shard(assignments, num_runners, seed, greedy_players)
    envs = max(1, min(num_envs, -(-len(assignments) // len(tasks))))
    members = [*opponents, *components]
    # the run's learner architecture: frozen LM members load onto the run's base model
    architecture = make_learner_architecture(config_from_dict(run.config))
    if backend == "serial":
        runner_backend = SerialBackend(spec.id, spec, architecture, envs, cache_size=len(members), seed=seed)
    else:
        runner_backend = ProcessBackend(spec.id, spec, architecture, envs, cache_size=len(members),
                                        num_workers=num_runners, seed=seed, log_dir=None)
    try:
        runner_backend.set_population(members)
        results = runner_backend.collect(runner_backend.submit(tasks, []))
    finally:
        runner_backend.close()
    matches = [_as_candidate(m, component_ids, candidate_id) for result in results for m in result.matches]

    ratings = stored_ratings(run.run_dir)
    with open_ledger(run.run_dir) as store:
        params = trueskill_params(store, run.config)
    kinds = {m.player_id: m.kind for m in opponents}
    per_opponent = tally_matches(matches, candidate_id, spec.team_of_seat, kinds, ratings)
    order = {m.player_id: i for i, m in enumerate(opponents)}
    per_opponent = tuple(sorted(per_opponent, key=lambda r: order[r.opponent]))
    total, score, lower, upper = overall(per_opponent)
    by_game = []
    for part in mix_parts(spec.id):
        own = [m for m in matches if match_game_id(spec.id, m.assignment.seed) == part.game_id]
        results = tuple(sorted(tally_matches(own, candidate_id, spec.team_of_seat, kinds, ratings),
                               key=lambda r: order[r.opponent]))
        if results:
            by_game.append(GameResults(part.game_id, results, *overall(results)))

    rated_games = [(opp, outcome) for opp, outcome in placement_games(matches, candidate_id,
                                                                      spec.team_of_seat) if opp in ratings]
    placement = fit_placement(rated_games, ratings, params) if rated_games else None
    rank = None
    if placement is not None:
        rank = 1 + sum(r.conservative > placement.conservative for r in ratings.values())
    bt = bt_placement(run.run_dir, [m.player_id for m in run.frozen()], candidate_id,
                      placement_games(matches, candidate_id, spec.team_of_seat), spec.id, seed)
    return EvaluationReport(
        checkpoint=str(checkpoint_path), snapshot_id=snapshot_id, game_id=spec.id,
        run_dir=str(run.run_dir), run_iteration=run.iteration,
        games_per_opponent=rotations_for(games_per_opponent, len(spec.sides)) * len(spec.sides),
        greedy=greedy, seed=seed, opponents=per_opponent, total_games=total, score=score, lower=lower, upper=upper,
        placement_mu=None if placement is None else placement.mu,
        placement_sigma=None if placement is None else placement.sigma,
        placement_games=len(rated_games), rank=rank, rated_members=len(ratings),
        seconds=time.perf_counter() - start, **bt, by_game=tuple(by_game))


def bt_placement(run_dir: str | os.PathLike, members: Sequence[str], candidate: str,
                 games: Sequence[tuple[str, float]], game_id: str, seed: int = 0, rounds: int = 1000) -> dict:
    """The candidate's Bradley-Terry place among `members`: one fit on the ledger's games between
    members (`ludus.league.api.RANKED_KINDS`, pairs as `ludus.league.records.ranking.ledger_records`) plus its
    evaluation `games` (opponent, its score), with bootstrap intervals; `EvaluationReport`'s bt_
    fields (empty when it played nobody)."""
    from ludus.league.api import RANKED_KINDS
    from ludus.league.records.ranking import Game, bootstrap_intervals, ledger_records
    from ludus.league.rundata import open_ledger

    if not games:
        return {}
    with open_ledger(run_dir) as store:
        records = ledger_records((r.result for r in store.iter_matches(kinds=RANKED_KINDS)), members)
    fitted = list(records.games) + [Game(candidate, opponent, score, game=game_id) for opponent, score in games]
    iv = bootstrap_intervals(fitted, rounds, seed)
    i = iv.ratings.players.index(candidate)
    return {"bt_rating": float(iv.ratings.rating[i]), "bt_low": float(iv.low[i]), "bt_high": float(iv.high[i]),
            "bt_rank": iv.ratings.ranks()[candidate], "bt_rank_low": int(iv.rank_low[i]),
            "bt_rank_high": int(iv.rank_high[i]), "bt_players": len(iv.ratings.players), "bt_games": len(fitted)}


def _mixture_members(directory: Path, mixture) -> list[Member]:
    """The components of a mixture checkpoint as frozen members with ids of their own."""
    members = []
    for component, path in zip(mixture.components, component_paths(directory, mixture)):
        player_id = f"eval:{component.player_id}"
        members.append(Member(player_id, "anchor", "evaluated", bot=component.bot) if path is None else
                       Member(player_id, "snapshot", "evaluated", snapshot_path=path,
                              snapshot_id=component.snapshot_id))
    return members


def _draw_components(assignments: Sequence[MatchAssignment], candidate_id: str, components: Sequence[Member],
                     weights: Sequence[float], seed: int) -> list[MatchAssignment]:
    """A mixture plays one component per game: each game seed draws one (by `weights`, from `seed`
    and the game seed), so both seat orders of a seed, and every opponent, meet the same one."""
    p = np.asarray(weights, dtype=np.float64) / sum(weights)
    drawn = {}
    out = []
    for a in assignments:
        if a.seed not in drawn:
            drawn[a.seed] = components[int(np.random.default_rng([seed, a.seed]).choice(len(components), p=p))]
        player = drawn[a.seed].player_id
        out.append(replace(a, players=tuple(player if p == candidate_id else p for p in a.players)))
    return out


def _as_candidate(match: PlayedMatch, component_ids: set[str], candidate_id: str) -> PlayedMatch:
    """The match as played by the evaluated checkpoint (a mixture's component ids folded into one)."""
    players = tuple(candidate_id if p in component_ids else p for p in match.assignment.players)
    return replace(match, assignment=replace(match.assignment, players=players))


# ---------------------------------------------------------------------------------------------
# Text


def format_results_table(results: Sequence[OpponentResult], title: str = "opponent") -> list[str]:
    """Rows of an aligned W/D/L table."""
    width = max([len(title), 7, *(len(r.opponent) for r in results)])
    lines = [f"{title:<{width}} {'kind':<8} {'games':>6} {'W':>5} {'D':>5} {'L':>5} {'score':>6}  "
             f"{'95% interval':<15} {'opp mu':>7}"]
    for r in results:
        mu = f"{r.opponent_mu:7.2f}" if r.opponent_mu is not None else f"{'-':>7}"
        lines.append(f"{r.opponent:<{width}} {r.kind:<8} {r.games:>6} {r.wins:>5} {r.draws:>5} {r.losses:>5} "
                     f"{r.score:6.3f}  [{r.lower:.3f}, {r.upper:.3f}]  {mu}")
    return lines


def format_evaluation(report: EvaluationReport) -> str:
    """The report as a table for people."""
    mode = "greedy" if report.greedy else "sampling"
    lines = [f"checkpoint {report.checkpoint} (snapshot {report.snapshot_id[:12]}, game {report.game_id})",
             f"against run {report.run_dir} at iteration {report.run_iteration}: {len(report.opponents)} opponents x "
             f"{report.games_per_opponent} games ({mode}, seed {report.seed}, every seed from every seat)"]
    lines += format_results_table(report.opponents)
    lines.append(f"overall: {report.total_games} games, score {report.score:.3f} "
                 f"[{report.lower:.3f}, {report.upper:.3f}]")
    for game in report.by_game:
        lines.append(f"game {game.game}: {game.total_games} games, score {game.score:.3f} "
                     f"[{game.lower:.3f}, {game.upper:.3f}]")
        lines += ["  " + line for line in format_results_table(game.opponents)]
    if report.placement is not None:
        p = report.placement
        lines.append(f"TrueSkill placement (opponents' ratings fixed, {report.placement_games} games): "
                     f"mu {p.mu:.2f} sigma {p.sigma:.2f} (mu-3s {p.conservative:.2f}), "
                     f"rank {report.rank} of {report.rated_members + 1} (the {report.rated_members} rated members "
                     f"and the checkpoint)")
    else:
        lines.append("TrueSkill placement: none of the opponents is rated yet")
    if report.bt_rating is not None:
        lines.append(f"Bradley-Terry placement ({report.bt_games:,} games: the ledger's between frozen members and "
                     f"these; ties as half wins): {report.bt_rating:.0f} [{report.bt_low:.0f}, {report.bt_high:.0f}], "
                     f"rank {report.bt_rank} of {report.bt_players} (95% interval of the rank {report.bt_rank_low}-"
                     f"{report.bt_rank_high})")
    lines.append(f"({report.seconds:.1f} s)")
    return "\n".join(lines)
