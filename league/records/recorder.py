"""Recording play: the ledger, TrueSkill ratings, the payoff table and the population.

Each runner batch is appended to the ledger in one transaction together with the TrueSkill
updates of its rating matches; training matches update only the payoff table (a live learner is
not a fixed player, so it is never rated) and the learners' freezing windows. The recorder is the
only writer of all four, so they never disagree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ludus.games.core import GameSpec
from ludus.games.mix import match_game_id, mix_parts
from ludus.league.checkpoint import RunError
from ludus.league.learners.learning import Learner
from ludus.league.records.ledger import MatchResult, PlayerRecord, SeatResult, Store, outcomes_from_returns
from ludus.league.records.payoff import PayoffTable
from ludus.league.records.population import Member, Population
from ludus.league.records.ratings import RatingTable, rate_and_record
from ludus.league.play.runner import PlayedMatch, PlayResult


@dataclass(frozen=True)
class Recorded:
    """What one iteration's play added to the ledger."""

    training: int
    rating: int
    learner_return: float | None
    """Mean episode return of the learners' seats in training matches (a team's seats count once)."""
    learner_length: float | None
    """Mean length of those matches."""


class Recorder:
    def __init__(self, store: Store, spec: GameSpec, population: Population, payoff: PayoffTable,
                 ratings: RatingTable):
        self.store = store
        self.spec = spec
        self.population = population
        self.payoff = payoff
        self.ratings = ratings
        self.game_payoffs: dict[str, PayoffTable] = {p.game_id: PayoffTable(payoff.decay) for p in mix_parts(spec.id)}
        """A run of several games (games/mix.py): each game's own payoff table, beside the combined
        one, so matchmaking (PFSP) reads how a learner fares in the game it is about to play."""

    def restore(self, population: Population, payoff: dict, ratings: dict,
                game_payoffs: Mapping[str, dict] | None = None) -> None:
        """As of a checkpoint. The ledger may hold matches of the interrupted iteration beyond it;
        those are played again identically, re-rated in order, not appended again (`record`)."""
        self.population, self.payoff, self.ratings = population, PayoffTable.from_json(payoff), RatingTable.from_json(ratings)
        if set(game_payoffs or {}) != set(self.game_payoffs):
            raise RunError(f"the checkpoint's per-game payoff tables ({sorted(game_payoffs or {})}) are not the run's "
                           f"games ({sorted(self.game_payoffs)}); the run cannot resume")
        self.game_payoffs = {game: PayoffTable.from_json(data) for game, data in (game_payoffs or {}).items()}

    def add_member(self, member: Member) -> None:
        self.population.add(member)
        if member.kind != "learner":
            self.payoff.add(member.player_id)
            for table in self.game_payoffs.values():
                table.add(member.player_id)
        if self.store.player(member.player_id) is not None:
            return  # re-created while replaying an interrupted iteration
        self.store.add_player(PlayerRecord(
            player_id=member.player_id, kind=member.kind, created_at=time.time(), role=member.role,
            snapshot_path=member.snapshot_path or "", snapshot_hash=member.snapshot_id or "",
            metadata={"parent": member.parent, "iteration": member.iteration, "steps": member.steps,
                      "bot": member.bot}))

    def record(self, results: list[PlayResult], learners: Mapping[str, Learner], checkpoint_seq: int,
               iteration: int | None = None) -> Recorded:
        """Append each runner batch (one transaction each); `iteration` (1-based, the one that
        played them) goes into each match's metadata, so `ludus matches --iteration` finds them.

        After a kill mid-iteration, resume plays the interrupted iteration again: matches already
        in the ledger beyond `checkpoint_seq` (same ids, same seeds, same play) are checked and
        re-rated in order, not appended twice."""
        already = self.store.max_match_id()
        training = rating = 0
        returns: list[float] = []
        lengths: list[int] = []
        now = time.time()
        for result in results:
            per_match = result.seconds / max(len(result.matches), 1)
            batch = [self._match_result(m, now, per_match, learners, iteration) for m in result.matches]
            new = [r for r in batch if r.match_id > already]
            replayed = [r for r in batch if r.match_id <= already]
            self._check_replayed(replayed, checkpoint_seq)
            for r in replayed:
                if r.kind == "rating":
                    self.ratings.update(r)
            if new:
                rate_and_record(self.store, self.ratings, new, kinds=("rating",))
            games = []
            for r in batch:
                if r.kind == "training":
                    training += 1
                    pairs = self._training_pairs(r, learners)
                    games.extend(pairs)
                    if self.game_payoffs:
                        self.game_payoffs[r.game_id].update_pairs(pairs)
                    seats = {s.team: s.episode_return for s in r.seats if s.player_id in learners}
                    returns.extend(seats.values())
                    lengths.extend([r.length] * len(seats))
                else:
                    rating += 1
            self.payoff.update_pairs(games)
        return Recorded(training, rating, float(np.mean(returns)) if returns else None,
                        float(np.mean(lengths)) if lengths else None)

    def _match_result(self, played: PlayedMatch, started_at: float, duration: float,
                      learners: Mapping[str, Learner], iteration: int | None = None) -> MatchResult:
        a = played.assignment
        teams = self.spec.team_of_seat
        outcomes = outcomes_from_returns(played.returns, teams)
        failed = played.text is not None and bool(played.text.error)
        seats = tuple(
            SeatResult(seat=s, team=teams[s], player_id=pid, episode_return=played.returns[s], outcome=outcomes[s],
                       player_version=self._version_label(pid, played.player_versions[s], learners),
                       status="error" if failed else "invalid" if s in played.forfeited else "ok",
                       error=played.text.error if failed else
                       "forfeited: gave no legal move" if s in played.forfeited else "",
                       metadata=answer_counts(played, s))
            for s, pid in enumerate(a.players))
        # a run of several games records each match under its own game (replayed alone from its seed)
        return MatchResult(match_id=a.match_id, kind=a.kind, game_id=match_game_id(self.spec.id, a.seed), seed=a.seed,
                           seats=seats,
                           length=played.length, started_at=started_at, duration_s=duration,
                           moves=tuple(played.moves), truncated=played.truncated,
                           metadata={**({} if iteration is None else {"iteration": iteration}),
                                     **({"texts": list(played.text.texts)} if played.text is not None else {}),
                                     **({"reasoning": [list(note) for note in played.said]} if played.said else {})})

    def _version_label(self, player_id: str, version: int, learners: Mapping[str, Learner]) -> str:
        if player_id in learners:
            return f"v{version}"
        member = self.population[player_id]
        return member.snapshot_id or member.bot or ""

    def _check_replayed(self, batch: list[MatchResult], checkpoint_seq: int) -> None:
        if not batch:
            return
        stored = {m.result.match_id: m.result for m in self.store.iter_matches(after_seq=checkpoint_seq)}
        for r in batch:
            old = stored.get(r.match_id)
            if old is not None and [s.episode_return for s in old.seats] != [s.episode_return for s in r.seats]:
                raise RunError(f"resumed play of match {r.match_id} differs from the ledger; the run is not "
                               f"deterministic (was the code or an installed package changed?)")

    def _training_pairs(self, match: MatchResult, learners: Mapping[str, Learner]) -> list[tuple[str, str, float]]:
        """(learner, opponent, learner's score) for the payoff table; counts the learner's window."""
        pairs = []
        for s in match.seats:
            learner = learners.get(s.player_id)
            if learner is None:
                continue
            opponents = {o.player_id: o for o in match.seats if o.team != s.team}  # a team counts once
            for o in opponents.values():
                if o.player_id == s.player_id:
                    continue  # self-play teaches the payoff table nothing
                # Head to head: did the learner's team finish above this opponent's?
                score = 1.0 if s.outcome > o.outcome else 0.5 if s.outcome == o.outcome else 0.0
                pairs.append((s.player_id, o.player_id, score))
                learner.count_game(score)
            if any(o != s.player_id for o in opponents):
                learner.count_return(s.episode_return)
            break  # one row per match for the learner (its other seats are the same team)
        return pairs


def answer_counts(played: PlayedMatch, seat: int) -> dict[str, int]:
    """A seat's text-play counts for the ledger's seat metadata: its turns and its invalid answers
    (those its agent answered again, and the moves the game judged invalid); {} for a seat with
    neither (no text agent played it and the game refused none of its moves)."""
    if not played.turns and played.text is None:
        return {}
    invalid = (played.invalid_answers[seat] if played.invalid_answers else 0) + \
        (played.text.invalid[seat] if played.text is not None and played.text.invalid else 0)
    turns = int(played.turns[seat]) if played.turns else 0
    return {"turns": turns, "invalid": int(invalid)} if turns or invalid else {}
