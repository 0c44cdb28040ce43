"""PFSP and friends, the payoff table, the rating scheduler, snapshot triggers, Wilson intervals."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import trueskill

from ludus.league.records.ledger import MatchResult, SeatResult, Store, outcomes_from_returns
from ludus.league.records.matchmaking import (
    MatchmakingMix,
    pfsp_weights,
    quality_weights,
    sample_opponents,
    sample_pfsp,
    sample_uniform,
    schedule_rating_matches,
    sigma_converged,
    snapshot_due,
)
from ludus.league.records.payoff import PayoffTable, pair_results, rebuild_payoff
from ludus.league.records.ratings import RatingTable, TrueSkillParams
from ludus.league.stats import wilson_interval, wilson_intervals


def match(match_id, players, returns, teams=None, kind="training") -> MatchResult:
    teams = list(teams) if teams is not None else list(range(len(players)))
    outcomes = outcomes_from_returns(returns, teams)
    return MatchResult(match_id=match_id, kind=kind, game_id="g", seed=match_id, length=10, started_at=0.0,
                       duration_s=0.0, seats=tuple(SeatResult(i, teams[i], p, r, o)
                                                   for i, (p, r, o) in enumerate(zip(players, returns, outcomes))))


# -- Wilson ---------------------------------------------------------------------------------------


def test_wilson_known_values():
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    lo, hi = wilson_interval(50, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.4038, 0.5962)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert round(wilson_interval(0, 10)[1], 4) == 0.2775
    lows, highs = wilson_intervals([8, 50, 0, 3.5], [10, 100, 0, 7])
    for k, (s, n) in enumerate([(8, 10), (50, 100), (0, 0), (3.5, 7)]):
        assert (lows[k], highs[k]) == pytest.approx(wilson_interval(s, n), abs=1e-15)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    # decayed counts may overshoot by rounding; that is not an error
    assert wilson_interval(10 * (1 + 1e-15), 10)[1] == 1.0
    assert wilson_intervals([10 * (1 + 1e-15)], [10])[1][0] == 1.0


# -- PFSP weights ---------------------------------------------------------------------------------


def test_pfsp_weights_literal():
    # P[learner beats candidate]: an unplayed pair has the prior 0.5
    x = [0.5, 0.25, 1.0, 0.0]
    raw_hard = np.array([0.25, 0.5625, 0.0, 1.0])  # (1 - x)^2
    np.testing.assert_allclose(pfsp_weights(x, "hard"), raw_hard / 1.8125, rtol=1e-15)
    np.testing.assert_allclose(pfsp_weights(x, "hard", p=1.0), np.array([0.5, 0.75, 0.0, 1.0]) / 2.25)
    np.testing.assert_allclose(pfsp_weights(x, "squared"), raw_hard / 1.8125)
    np.testing.assert_allclose(pfsp_weights(x, "linear"), np.array([0.5, 0.75, 0.0, 1.0]) / 2.25)
    np.testing.assert_allclose(pfsp_weights(x, "var"), np.array([0.25, 0.1875, 0.0, 0.0]) / 0.4375)
    # every raw weight zero -> uniform rather than a division by zero
    np.testing.assert_array_equal(pfsp_weights([1.0, 1.0, 1.0], "hard"), np.full(3, 1 / 3))
    np.testing.assert_array_equal(pfsp_weights([0.0, 1.0], "var"), [0.5, 0.5])
    with pytest.raises(ValueError, match="weighting"):
        pfsp_weights(x, "cubic")
    with pytest.raises(ValueError):
        pfsp_weights([1.5], "hard")


def test_pfsp_weights_from_payoff_with_zero_game_entries():
    payoff = PayoffTable(decay=1.0)
    payoff.update("learner", "beaten", 1.0)  # one win: P = (1 + 1) / (1 + 2) = 2/3
    payoff.update("learner", "drawn", 0.5)   # one draw: P = (0.5 + 1) / 3 = 1/2
    candidates = ["beaten", "drawn", "never_played"]
    probs = payoff.win_probs("learner", candidates)
    np.testing.assert_allclose(probs, [2 / 3, 0.5, 0.5], rtol=1e-15)
    raw = np.array([(1 / 3) ** 2, 0.25, 0.25])
    np.testing.assert_allclose(pfsp_weights(probs, "hard"), raw / raw.sum(), rtol=1e-15)
    np.testing.assert_allclose(payoff.win_probs("stranger", candidates), [0.5, 0.5, 0.5])


def test_samplers_follow_weights():
    rng = np.random.default_rng(0)
    candidates = ["a", "b", "c"]
    draws = [sample_pfsp(rng, candidates, [0.0, 0.5, 1.0], "hard") for _ in range(4000)]
    frequencies = np.bincount(draws, minlength=3) / 4000
    np.testing.assert_allclose(frequencies, [0.8, 0.2, 0.0], atol=0.03)
    uniform = np.bincount([sample_uniform(rng, candidates) for _ in range(3000)], minlength=3) / 3000
    np.testing.assert_allclose(uniform, [1 / 3] * 3, atol=0.04)


# -- payoff table ---------------------------------------------------------------------------------


def test_payoff_decay_by_hand():
    payoff = PayoffTable(decay=0.5)
    payoff.update("A", "C", 1.0)
    payoff.update("A", "B", 1.0)   # wins 1,    draws 0,   games 1
    payoff.update("B", "A", 0.5)   # wins 0.5,  draws 1,   games 1.5
    payoff.update("B", "A", 1.0)   # wins 0.25, draws 0.5, games 1.75; B's wins 1
    assert payoff.counts("A", "B") == (0.25, 0.5, 1.75)
    assert payoff.counts("B", "A") == (1.0, 0.5, 1.75)
    assert payoff.win_prob("A", "B") == pytest.approx((0.25 + 0.25 + 1) / 3.75)  # 0.4
    assert payoff.win_prob("B", "A") == pytest.approx(0.6)
    assert payoff.counts("A", "C") == (1.0, 0.0, 1.0)  # decay is per pair: A-C untouched
    matrix = payoff.win_prob_matrix(["A", "B", "C", "unknown"])
    np.testing.assert_allclose(matrix[0], [0.5, 0.4, 2 / 3, 0.5])
    np.testing.assert_allclose(matrix + matrix.T, np.ones((4, 4)))
    with pytest.raises(ValueError):
        payoff.update("A", "A", 1.0)


def test_payoff_batched_updates_growth_and_json_are_exact():
    rng = random.Random(11)
    players = [f"p{i}" for i in range(40)]  # grows past the initial capacity of 16
    games = []
    for _ in range(3000):
        a, b = rng.sample(players, 2)
        games.append((a, b, rng.choice([0.0, 0.5, 1.0])))
    one_by_one = PayoffTable(decay=0.97)
    for game in games:
        one_by_one.update(*game)
    batched = PayoffTable(decay=0.97)
    for start in range(0, len(games), 700):
        batched.update_pairs(games[start:start + 700])
    assert batched.to_json() == one_by_one.to_json()
    restored = PayoffTable.from_json(one_by_one.to_json())
    np.testing.assert_array_equal(restored.win_prob_matrix(players), one_by_one.win_prob_matrix(players))
    a, b, _ = games[0]
    assert restored.counts(a, b) == one_by_one.counts(a, b)


def test_payoff_pairs_from_matches_and_rebuild(tmp_path):
    ffa = match(1, ["x", "y", "z"], [3.0, 1.0, 1.0])
    teams = match(2, ["x", "y", "z", "w"], [1.0, 0.0, 1.0, 0.0], teams=[0, 1, 0, 1])
    selfplay = match(3, ["x", "x"], [1.0, -1.0])
    assert list(pair_results([ffa])) == [("x", "y", 1.0), ("x", "z", 1.0), ("y", "z", 0.5)]
    assert list(pair_results([teams])) == [("x", "y", 1.0), ("x", "w", 1.0), ("y", "z", 0.0), ("z", "w", 1.0)]
    assert list(pair_results([selfplay])) == []
    live = PayoffTable(decay=0.9)
    with Store.open(tmp_path) as store:
        rng = random.Random(2)
        for batch_start in range(0, 200, 50):
            batch = [match(k, rng.sample(["l", "s1", "s2", "s3"], 2), [rng.choice([-1.0, 0.0, 1.0]), 0.0],
                           kind=rng.choice(["training", "rating", "evaluation"]))
                     for k in range(batch_start, batch_start + 50)]
            store.record_matches(batch)
            live.update_matches(m for m in batch if m.kind in ("training", "rating"))
        rebuilt = rebuild_payoff(store, decay=0.9)
    assert rebuilt.to_json() == live.to_json()


# -- opponent sampling ----------------------------------------------------------------------------


def test_sample_opponents_mix_and_determinism():
    candidates = [f"s{i}" for i in range(5)]
    payoff = PayoffTable()
    for _ in range(20):
        payoff.update("learner", "s0", 1.0)  # s0 is beaten: PFSP "hard" almost never picks it
    ratings = RatingTable()
    mix = MatchmakingMix(self_play=0.35, pfsp=0.5, uniform=0.15)
    picks = sample_opponents(np.random.default_rng(42), mix, "learner", candidates, payoff, ratings, 4000)
    again = sample_opponents(np.random.default_rng(42), mix, "learner", candidates, payoff, ratings, 4000)
    assert picks == again and len(picks) == 4000
    assert set(picks) <= set(candidates) | {"learner"}
    assert picks.count("learner") / 4000 == pytest.approx(0.35, abs=0.03)
    # s0 only through the uniform part: 0.15 / 5 plus PFSP's tiny weight on it
    assert picks.count("s0") / 4000 == pytest.approx(0.03, abs=0.015)
    assert sample_opponents(np.random.default_rng(0), mix, "learner", [], payoff, ratings, 3) == ["learner"] * 3
    with pytest.raises(ValueError, match="payoff"):
        sample_opponents(np.random.default_rng(0), MatchmakingMix(pfsp=1.0), "learner", candidates, None, None, 5)
    with pytest.raises(ValueError):
        MatchmakingMix(self_play=0.0, pfsp=0.0)


def test_quality_weights_and_quality_sampling():
    params = TrueSkillParams()
    ratings = RatingTable(params)
    for k, winner in enumerate(["a", "a", "a", "b"]):
        ratings.update(match(k, [winner, "c"], [1.0, -1.0], kind="rating"))
    candidates = ["b", "c", "new"]
    env = trueskill.TrueSkill(tau=0.0)
    me = ratings.rating("a")
    raw = [trueskill.quality_1vs1(trueskill.Rating(me.mu, me.sigma),
                                  trueskill.Rating(ratings.rating(c).mu, ratings.rating(c).sigma), env=env)
           for c in candidates]
    np.testing.assert_allclose(quality_weights(ratings, "a", candidates), np.array(raw) / sum(raw), rtol=1e-12)
    picks = sample_opponents(np.random.default_rng(1), MatchmakingMix(pfsp=0.0, quality=1.0), "a", candidates,
                             None, ratings, 3000)
    frequencies = np.array([picks.count(c) for c in candidates]) / 3000
    np.testing.assert_allclose(frequencies, np.array(raw) / sum(raw), atol=0.03)


# -- rating scheduler -----------------------------------------------------------------------------


def test_schedule_rating_matches_favours_uncertain_players():
    params = TrueSkillParams()
    ratings = RatingTable(params)
    settled = [f"old{i}" for i in range(30)]
    rng = random.Random(0)
    for k in range(900):  # settle the old pool
        a, b = rng.sample(settled, 2)
        ratings.update(match(k, [a, b], [1.0, -1.0] if settled.index(a) > settled.index(b) else [-1.0, 1.0],
                             kind="rating"))
    players = settled + ["newcomer"]
    pairs = schedule_rating_matches(np.random.default_rng(3), ratings, players, 40)
    assert len(pairs) == 40 and all(a != b for a, b in pairs)
    assert all(a in players and b in players for a, b in pairs)
    newcomer_games = sum("newcomer" in pair for pair in pairs)
    assert newcomer_games >= 8  # the prior sigma (8.3) vs ~1-2 for the settled pool
    assert pairs == schedule_rating_matches(np.random.default_rng(3), ratings, players, 40)
    assert {p[0] == "newcomer" for p in pairs if "newcomer" in p} == {True, False}  # random seat order
    assert schedule_rating_matches(np.random.default_rng(0), ratings, ["solo"], 5) == []
    assert not sigma_converged(ratings, players, threshold=3.0)
    assert sigma_converged(ratings, settled, threshold=3.0)
    assert sigma_converged(ratings, [], threshold=0.1)


def test_schedule_rating_matches_between_two_sides():
    """Predators meet prey (an anchor either), side 0 in the first seat, the newest member most."""
    ratings = RatingTable(TrueSkillParams())
    old = [f"predators@{i}" for i in range(4)] + [f"prey@{i}" for i in range(4)] + ["anchor:random"]
    rng = random.Random(1)
    for k in range(400):  # settle the old members against the other side
        a, b = f"predators@{rng.randrange(4)}", rng.choice([f"prey@{rng.randrange(4)}", "anchor:random"])
        ratings.update(match(k, [a, b], [1.0, -1.0] if rng.random() < 0.5 else [-1.0, 1.0], kind="rating"))
    players = old + ["prey@4"]
    sides = [0] * 4 + [1] * 4 + [None, 1]
    pairs = schedule_rating_matches(np.random.default_rng(5), ratings, players, 30, sides)
    side = dict(zip(players, sides))
    assert len(pairs) == 30
    assert all(side[a] in (0, None) and side[b] in (1, None) and a != b for a, b in pairs)
    assert sum("prey@4" in pair for pair in pairs) >= 8
    assert pairs == schedule_rating_matches(np.random.default_rng(5), ratings, players, 30, sides)
    # a side nobody can meet plays no games, and the scheduler does not loop forever
    assert schedule_rating_matches(np.random.default_rng(0), ratings, ["prey@0", "prey@1"], 5, [1, 1]) == []


# -- snapshot trigger -----------------------------------------------------------------------------


def test_snapshot_due():
    assert snapshot_due(10_000, 10_000, 0, 0, 0, None)
    assert not snapshot_due(9_999, 10_000, 0, 0, 0, None)
    # Wilson lower bound of 18 wins in 20 games is 0.699
    assert round(wilson_interval(18, 20)[0], 3) == 0.699
    assert snapshot_due(5, 10_000, 18, 0, 20, 0.65)
    assert not snapshot_due(5, 10_000, 18, 0, 20, 0.75)
    assert not snapshot_due(5, 10_000, 16, 4, 20, 0.75)  # draws count half: 18/20 again
    assert snapshot_due(5, None, 17, 2, 20, 0.65)
    assert not snapshot_due(5, None, 0, 0, 0, 0.1)  # no games, no evidence
    assert not snapshot_due(10**9, None, 20, 0, 20, None)


def test_best_responses_freeze_when_their_gain_stops():
    """The plateau rule (ludus.league.learners.learning.track_gain): an exponential moving average of the mean
    training return spanning `snapshot_on_plateau` iterations; frozen after that many iterations
    without a new best by `plateau_min_gain`; the state survives JSON and restarts at a snapshot."""
    from ludus.league.checkpoint import LearnerState
    from ludus.league.config import LeagueConfig, RoleConfig
    from ludus.league.learners.learning import Learner, due_for_snapshot, plateaued, track_gain

    role = RoleConfig(meta_nash=1.0, self_play=0, pfsp=0, uniform=0, snapshot_on_plateau=3, plateau_min_gain=0.1)
    config = LeagueConfig(snapshot_every_steps=10**9, snapshot_win_rate_lcb=0.0, roles=(role,))
    learner = Learner(role, None, LearnerState())

    def iteration(*returns: float) -> None:
        for r in returns:
            learner.count_return(r)
        track_gain(learner)

    iteration(-1.0, -1.0)
    assert learner.state.gain == (-1.0, -1.0, 0) and learner.state.returns == (0.0, 0.0)
    iteration(1.0)  # smoothed: -1 + 0.5 * (1 - -1) = 0: a new best
    assert learner.state.gain == (0.0, 0.0, 0)
    iteration(0.1)  # 0.05: not 0.1 better
    iteration(0.1)
    assert learner.state.gain[2] == 2 and not plateaued(learner) and not due_for_snapshot(learner, config)
    assert LearnerState.from_json(json.loads(json.dumps(learner.state.to_json()))) == learner.state
    track_gain(learner)  # an iteration without training games changes nothing
    assert learner.state.gain[2] == 2
    iteration(0.1)
    assert plateaued(learner) and due_for_snapshot(learner, config)
    # Off by default: the same returns never plateau.
    off = Learner(RoleConfig(), None, LearnerState())
    for _ in range(10):
        off.count_return(0.0)
        track_gain(off)
    assert off.state.gain is None and not plateaued(off)
