"""Planning one iteration: who plays whom, under which match ids and seeds, on which runner.

`Planner.plan` is a function of its arguments (the iteration, the first free match id, the league
as it stands and the matchmaking RNG) and changes nothing but the RNG it is given, so the loop
may plan iteration i+1 before iteration i is recorded (asynchronous mode) by simply passing i+1.

Each learner role fills every seat of one side (a team shares one policy; in a free-for-all a
side is one seat); every other side gets one opponent drawn by the role's matchmaking mix
(self-play / PFSP / uniform over its candidate pool, or PSRO's meta-Nash mixture). A
`rating_share` of the games are rating matches between frozen members, scheduled by rating
uncertainty and match quality. Matches are split into one task per runner shard.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from ludus.games.core import GameSpec
from ludus.games.mix import match_game_id, mix_parts
from ludus.league.config import LeagueConfig, RoleConfig
from ludus.league.records.matchmaking import MatchmakingMix, sample_opponents, schedule_rating_matches
from ludus.league.records.payoff import PayoffTable
from ludus.league.records.population import Member, Population
from ludus.league.records.ratings import RatingTable
from ludus.league.play.runner import MatchAssignment, PlayTask
from ludus.league.seeds import SAMPLING, match_seed, stream_seed


@dataclass(frozen=True)
class LeagueView:
    """The league as the planner reads it (nothing in it is modified)."""

    population: Population
    payoff: PayoffTable
    ratings: RatingTable
    learner_versions: Mapping[str, int]
    """Each live learner's policy version, in role order."""
    game_payoffs: Mapping[str, PayoffTable] = field(default_factory=dict)
    """A run of several games: each game's payoff table (PFSP reads the one of the match's game)."""


@dataclass(frozen=True)
class Plan:
    iteration: int
    tasks: tuple[PlayTask, ...]
    next_match_id: int
    """The first match id the plan did not use."""


class Planner:
    def __init__(self, config: LeagueConfig, spec: GameSpec, run_dir: Path):
        self.config = config
        self.spec = spec
        self.run_dir = run_dir
        """Read by PSRO's meta-game (the payoffs of frozen members are cached there)."""
        self.sides = list(spec.sides)
        self.mixed = bool(mix_parts(spec.id))

    def plan(self, iteration: int, first_match_id: int, league: LeagueView, rng: np.random.Generator,
             matches: int | None = None) -> Plan:
        """An iteration's matches: `matches` training matches (default the config's
        `matches_per_iteration`) and rating matches in the config's share of them."""
        matches = self.config.matches_per_iteration if matches is None else matches
        if matches < 1:
            raise ValueError(f"an iteration plays at least one training match, not {matches}")
        ids = itertools.count(first_match_id)
        assignments = self._training_matches(iteration, matches, league, rng, ids)
        assignments += self._rating_matches(matches, league, rng, ids)
        return Plan(iteration, self._shard(iteration, assignments, league), next(ids))

    def closing(self, iteration: int, first_match_id: int, league: LeagueView, rng: np.random.Generator) -> Plan:
        """The closing round after the last iteration: only rating matches (scheduled by rating
        uncertainty, so the snapshots frozen last, which no iteration has rated, play first)."""
        ids = itertools.count(first_match_id)
        rating = self._rating_matches(self.config.matches_per_iteration, league, rng, ids)
        return Plan(iteration, self._shard(iteration, rating, league), next(ids))

    # ------------------------------------------------------------------------------- training

    def _training_matches(self, iteration: int, matches: int, league: LeagueView, rng: np.random.Generator,
                          ids: Iterator[int]) -> list[MatchAssignment]:
        config, sides = self.config, self.sides
        shares = np.array([r.learner_share for r in config.roles])
        counts = np.maximum(np.floor(matches * shares / shares.sum()).astype(int), 1)
        out: list[MatchAssignment] = []
        for role, count in zip(config.roles, counts.tolist()):
            mix = (MatchmakingMix(self_play=role.self_play, pfsp=role.pfsp, uniform=role.uniform,
                                  pfsp_weighting=role.pfsp_weighting, pfsp_p=role.pfsp_power)
                   if role.self_play + role.pfsp + role.uniform > 0 else None)
            candidates = self._candidates(role, league.population)
            match_ids = [next(ids) for _ in range(count)]
            per_match = 1 if role.team is not None else len(sides) - 1
            draws_of_side: dict[int, list[str]] = {}
            # A run of several games draws each game's opponents by that game's payoffs (PFSP per
            # game); the matches' games follow from their seeds, known before play.
            for game, js in self._by_game(match_ids).items():
                payoff = league.game_payoffs[game] if game is not None else league.payoff
                if role.team is None:
                    # Symmetric game: every other side draws from the same pool.
                    drawn = self._draw_opponents(role, mix, candidates, len(js) * per_match, league, rng, payoff)
                    for side in range(len(sides)):
                        _scatter(draws_of_side.setdefault(side, [""] * count * per_match), js, per_match, drawn)
                    continue
                for side in range(len(sides)):
                    if side == role.team:
                        continue
                    pool = [c for c in candidates if self._side_of(league.population[c]) in (None, side)]
                    drawn = sample_opponents(rng, mix, role.name, pool, payoff, league.ratings, len(js))
                    # Asymmetric sides: 'self-play' means the newest snapshot of the other side.
                    newest = pool[-1] if pool else role.name
                    _scatter(draws_of_side.setdefault(side, [""] * count), js, 1,
                             [newest if d == role.name else d for d in drawn])
            for j, match_id in enumerate(match_ids):
                # In symmetric games the learner takes every side in turn, so all seats are learnt.
                own = role.team if role.team is not None else (iteration * count + j) % len(sides)
                side_players, k = [], 0
                for side in range(len(sides)):
                    if side == own:
                        side_players.append(role.name)
                    elif role.team is None:
                        side_players.append(draws_of_side[side][j * (len(sides) - 1) + k])
                        k += 1
                    else:
                        side_players.append(draws_of_side[side][j])
                out.append(self._assign(match_id, side_players, "training"))
        return out

    def _by_game(self, match_ids: list[int]) -> dict[str | None, list[int]]:
        """The positions of `match_ids` by the game each match plays (a run of several games), in
        the games' order; {None: all of them} for a run of one game."""
        if not self.mixed:
            return {None: list(range(len(match_ids)))}
        groups: dict[str | None, list[int]] = {p.game_id: [] for p in mix_parts(self.spec.id)}
        for j, match_id in enumerate(match_ids):
            groups[match_game_id(self.spec.id, match_seed(self.config.seed, match_id))].append(j)
        return {game: js for game, js in groups.items() if js}

    def _candidates(self, role: RoleConfig, population: Population) -> list[str]:
        """The opponent pool of a role (AlphaStar, Vinyals et al. 2019, 'League composition')."""
        frozen = population.frozen()
        if role.kind == "main_exploiter":
            # Main exploiters attack the main agents: their snapshots (latest ones matter most;
            # PFSP 'var' weighting keeps it on the ones it can almost beat).
            mains = [r.name for r in self.config.roles if r.kind == "main"]
            pool = [m.player_id for m in frozen if m.kind == "snapshot" and m.role in mains]
        else:
            pool = [m.player_id for m in frozen]
        # Bound the distinct opponents per iteration (bounds inference batches and cache churn):
        # keep the newest ones and the anchors.
        limit = self.config.max_opponents_per_iteration
        if len(pool) > limit:
            anchors = [p for p in pool if population[p].kind == "anchor"]
            rest = [p for p in pool if population[p].kind != "anchor"]
            pool = anchors + rest[-(limit - len(anchors)):] if limit > len(anchors) else anchors[:limit]
        return pool

    def _draw_opponents(self, role: RoleConfig, mix: MatchmakingMix | None, candidates: list[str], n: int,
                        league: LeagueView, rng: np.random.Generator, payoff: PayoffTable) -> list[str]:
        """n opponents: a `meta_nash` share from the meta-game's meta-strategy, the rest by `mix`
        (PFSP reading `payoff`)."""
        total = role.self_play + role.pfsp + role.uniform + role.meta_nash
        num_nash = int(rng.binomial(n, role.meta_nash / total)) if role.meta_nash > 0 and candidates else 0
        drawn: list[str] = []
        if num_nash:
            from ludus.league.psro import MetaSolver, meta_strategy

            members = [league.population[c] for c in candidates]
            weights = meta_strategy(self.spec, members, self.run_dir, MetaSolver.of(role))
            drawn = [candidates[i] for i in rng.choice(len(candidates), size=num_nash, p=weights).tolist()]
        if n - num_nash > 0:
            drawn += sample_opponents(rng, mix, role.name, candidates, payoff, league.ratings, n - num_nash)
        if not num_nash:
            return drawn
        # Interleave deterministically so seat rotation mixes both kinds of opponents.
        order = rng.permutation(len(drawn))
        return [drawn[i] for i in order.tolist()]

    # ------------------------------------------------------------------------------- rating

    def _rating_matches(self, training_matches: int, league: LeagueView, rng: np.random.Generator,
                        ids: Iterator[int]) -> list[MatchAssignment]:
        """Rating matches between frozen members: a `rating_share` of all games."""
        config, sides = self.config, self.sides
        frozen = [m.player_id for m in league.population.frozen()]
        num_rating = int(round(training_matches * config.rating_share / (1 - config.rating_share)))
        if len(sides) < 2 or len(frozen) < 2 or num_rating <= 0:
            return []
        if len(sides) == 2:
            # Pairs by rating uncertainty and match quality (the arena's ladder too), so that a new
            # snapshot is rated within a few iterations; with two different sides (predators and
            # prey) each member meets the other side's.
            symmetric = all(r.team is None for r in config.roles)
            side_of = None if symmetric else [self._side_of(league.population[p]) for p in frozen]
            return [self._assign(next(ids), [a, b], "rating")
                    for a, b in schedule_rating_matches(rng, league.ratings, frozen, num_rating, side_of)]
        pools = [[p for p in frozen if self._side_of(league.population[p]) in (None, side)]
                 for side in range(len(sides))]
        if any(not pool for pool in pools):
            return []
        out = []
        for _ in range(num_rating):
            chosen: list[str] = []
            for pool in pools:
                fresh = [p for p in pool if p not in chosen]
                if not fresh:
                    # A player cannot hold two sides of one rating match: wait for more members.
                    return out
                chosen.append(fresh[int(rng.integers(len(fresh)))])
            out.append(self._assign(next(ids), chosen, "rating"))
        return out

    # ------------------------------------------------------------------------------- helpers

    def _side_of(self, member: Member) -> int | None:
        """The side a frozen member plays in an asymmetric team game (None: any side)."""
        role = next((r for r in self.config.roles if r.name == member.role), None)
        return role.team if role is not None else None

    def _assign(self, match_id: int, side_players: list[str], kind: str) -> MatchAssignment:
        players = [""] * self.spec.num_players
        for seats, player in zip(self.sides, side_players):
            for seat in seats:
                players[seat] = player
        return MatchAssignment(match_id, match_seed(self.config.seed, match_id), tuple(players), kind)

    def _shard(self, iteration: int, assignments: list[MatchAssignment], league: LeagueView) -> tuple[PlayTask, ...]:
        shards = self.config.num_runners
        # Contiguous chunks: tasks in order hold matches in id order (the ledger order).
        bounds = np.linspace(0, len(assignments), shards + 1).astype(int)
        learners = tuple(league.learner_versions)
        versions = tuple(league.learner_versions.values())
        tasks = []
        for shard in range(shards):
            chunk = tuple(assignments[bounds[shard]:bounds[shard + 1]])
            if chunk:
                tasks.append(PlayTask(
                    task_id=iteration * shards + shard, assignments=chunk,
                    sample_seed=stream_seed(self.config.seed, SAMPLING, iteration, shard),
                    learners=learners, learner_versions=versions,
                    gamma=self.config.ppo.gamma, gae_lambda=self.config.ppo.gae_lambda))
        return tuple(tasks)


def _scatter(out: list[str], positions: list[int], per_match: int, drawn: list[str]) -> None:
    """Put `drawn` (`per_match` opponents for each of `positions`, in order) at those matches' slots of `out`."""
    for k, j in enumerate(positions):
        out[j * per_match:(j + 1) * per_match] = drawn[k * per_match:(k + 1) * per_match]
