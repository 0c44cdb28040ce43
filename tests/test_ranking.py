"""league/records/ranking.py: Bradley-Terry (against choix and by hand), bootstrap intervals, Nash
averaging's invariance to copies, rank stability on a ledger with a known answer, forfeits."""

from __future__ import annotations

import itertools
import math

import choix
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ludus.league.records.ranking import (SCALE, Game, Match, RankingError, bootstrap_intervals, fit,
                                forfeit_dependence_warnings, forfeit_rates, format_ranking, nash_average,
                                payoff_matrix, rank_stability, ratings_without_forfeits)

PLAYERS = ("ann", "bob", "cy", "dee", "eve", "fay")


def record(a: str, b: str, a_wins: int, b_wins: int, draws: int = 0) -> list[Game]:
    return [Game(a, b, 1.0)] * a_wins + [Game(a, b, 0.0)] * b_wins + [Game(a, b, 0.5)] * draws


def random_games(count: int, players=PLAYERS, seed: int = 0, draws: float = 0.15) -> list[Game]:
    rng = np.random.default_rng(seed)
    strength = rng.normal(size=len(players))
    games = []
    for _ in range(count):
        a, b = rng.choice(len(players), 2, replace=False)
        p, u = 1 / (1 + math.exp(strength[b] - strength[a])), rng.random()
        games.append(Game(players[a], players[b], 0.5 if u < draws else float(u < draws + (1 - draws) * p)))
    return games


def test_bradley_terry_matches_choix_with_the_same_prior():
    games = random_games(80, seed=3)
    ratings = fit(games, alpha=0.05)
    index = {p: i for i, p in enumerate(ratings.players)}
    # choix has no draws: two comparisons per game (a draw is one each way) doubles the
    # likelihood, so choix's alpha is doubled too for the same optimum.
    data = []
    for g in games:
        a, b = index[g.a], index[g.b]
        data += [(a, b)] * round(2 * g.score_a) + [(b, a)] * round(2 * (1 - g.score_a))
    theirs = choix.opt_pairwise(len(index), data, alpha=0.1, tol=1e-12)
    np.testing.assert_allclose(ratings.log_strength, theirs - theirs.mean(), atol=1e-6)
    decisive = [g for g in games if g.score_a != 0.5]
    data = [(index[g.a], index[g.b]) if g.score_a == 1 else (index[g.b], index[g.a]) for g in decisive]
    theirs = choix.opt_pairwise(len(index), data, alpha=0.05, tol=1e-12)
    np.testing.assert_allclose(fit(decisive, alpha=0.05, players=ratings.players).log_strength,
                               theirs - theirs.mean(), atol=1e-6)
    assert ratings.rating.mean() == pytest.approx(1000.0)
    np.testing.assert_allclose(ratings.rating - 1000, SCALE * ratings.log_strength)


def test_two_players_by_hand_and_draws_as_half_wins():
    # P(a beats b) = wins / (wins + losses) at the maximum likelihood: theta_a - theta_b = log(7 / 3).
    r = fit(record("a", "b", 7, 3), alpha=1e-10)
    assert r.log_strength[0] - r.log_strength[1] == pytest.approx(math.log(7 / 3), abs=1e-6)
    assert r.rating[0] - r.rating[1] == pytest.approx(400 * math.log10(7 / 3), abs=1e-4)
    # 3 wins and 1 draw are 3.5 wins to 0.5: odds 7.
    r = fit(record("a", "b", 3, 0, draws=1), alpha=1e-10)
    assert r.log_strength[0] - r.log_strength[1] == pytest.approx(math.log(7), abs=1e-6)
    # Two draws are exactly one win and one loss; a weight-2 game is the game twice.
    base = record("a", "c", 2, 1) + record("b", "c", 1, 1)
    np.testing.assert_allclose(fit(base + record("a", "b", 0, 0, draws=2)).log_strength,
                               fit(base + record("a", "b", 1, 1)).log_strength, atol=1e-9)
    np.testing.assert_allclose(fit(base + [Game("a", "b", 1.0, weight=2.0)]).log_strength,
                               fit(base + record("a", "b", 2, 0)).log_strength, atol=1e-9)


def test_undefeated_and_disconnected_players_stay_finite():
    r = fit(record("a", "b", 10, 0) + record("c", "d", 1, 1), players=("a", "b", "c", "d", "idle"))
    assert np.isfinite(r.rating).all() and r.ranks()["a"] == 1
    assert r.rating[4] == pytest.approx(1000.0) and r.games.tolist() == [10, 10, 2, 2, 0]


def test_equal_weight_per_game_kind():
    games = [Game("a", "b", 1.0, game="chess")] * 10 + [Game("a", "b", 0.0, game="go")] * 2
    assert fit(games).rating[0] - fit(games).rating[1] == pytest.approx(400 * math.log10(5), abs=2)
    tied = fit(games, by_game=True)
    assert tied.rating[0] == pytest.approx(tied.rating[1])


def test_refusals_say_what_to_do():
    with pytest.raises(RankingError, match="no games"):
        fit([])
    with pytest.raises(RankingError, match="itself"):
        fit([Game("a", "a", 1.0)])
    with pytest.raises(RankingError, match="score must be"):
        fit([Game("a", "b", 2.0)])
    with pytest.raises(RankingError, match="alpha"):
        fit(record("a", "b", 1, 1), alpha=0.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from("abcd"), st.sampled_from([0.0, 0.5, 1.0])),
                min_size=1, max_size=25), st.randoms(use_true_random=False), st.sampled_from("abcd"),
       st.sampled_from("abcd"))
def test_order_never_matters_and_a_win_never_lowers_the_winner(rows, random, winner, loser):
    games = [Game(a, b, s) for a, b, s in rows if a != b]
    players = tuple("abcd")
    if not games or winner == loser:
        return
    shuffled = list(games)
    random.shuffle(shuffled)
    before = fit(games, players=players)
    np.testing.assert_allclose(fit(shuffled, players=players).rating, before.rating, atol=1e-7)
    after = fit(games + [Game(winner, loser, 1.0)], players=players)
    assert after.rating[players.index(winner)] >= before.rating[players.index(winner)] - 1e-7


def test_bootstrap_intervals_contain_the_estimate_and_shrink_with_more_games():
    games = random_games(300, seed=1)
    small = bootstrap_intervals(games, rounds=400, seed=7)
    big = bootstrap_intervals(games * 4, rounds=400, seed=np.random.default_rng(7))
    for iv in (small, big):
        assert (iv.low <= iv.ratings.rating).all() and (iv.ratings.rating <= iv.high).all()
        ranks = iv.ratings.ranks()
        assert all(iv.rank_low[i] <= ranks[p] <= iv.rank_high[i] for i, p in enumerate(iv.ratings.players))
    assert (big.high - big.low < small.high - small.low).all()
    assert np.mean((big.high - big.low) / (small.high - small.low)) < 0.7  # ~1/2 for 4x the games
    again = bootstrap_intervals(games, rounds=400, seed=7)
    np.testing.assert_array_equal(again.low, small.low)
    lines = format_ranking(small.ratings, small)
    assert len(lines) == 1 + len(PLAYERS) and "95% interval" in lines[0]


def test_nash_average_ignores_copies_where_the_mean_does_not():
    # A cycle R > P > S > R (in the equilibrium), a dominated D and an outsider E.
    P = np.array([[.5, .7, .2, .8, .6], [.3, .5, .9, .6, .55], [.8, .1, .5, .7, .4],
                  [.2, .4, .3, .5, .45], [.4, .45, .6, .55, .5]])
    base = nash_average("RPSDE", P)
    np.testing.assert_allclose(base.weights, [4 / 9, 3 / 9, 2 / 9, 0, 0], atol=1e-7)
    np.testing.assert_allclose(base.scores[:3], 0, atol=1e-9)
    assert (base.scores[3:] < 0).all()
    k = 3
    grown = np.full((5 + k, 5 + k), 0.5)
    index = list(range(5)) + [0] * k  # three more R's
    for i, j in itertools.product(range(5 + k), repeat=2):
        if index[i] != index[j]:
            grown[i, j] = P[index[i], index[j]]
    copies = nash_average(tuple("RPSDE") + ("R2", "R3", "R4"), grown)
    np.testing.assert_allclose(copies.scores[:5], base.scores, atol=1e-6)
    np.testing.assert_allclose(copies.weights[[0, 5, 6, 7]], base.weights[0] / (k + 1), atol=1e-6)
    mean = lambda M: (M.sum(1) - 0.5) / (len(M) - 1)
    assert np.abs(mean(grown)[1:5] - mean(P)[1:5]).min() > 0.02  # every other mean moves


def test_nash_average_prefers_maximum_entropy_and_handles_unplayed_pairs():
    even = nash_average("abc", np.full((3, 3), 0.5))  # every mixture is an equilibrium
    np.testing.assert_allclose(even.weights, 1 / 3, atol=1e-6)
    players, P = payoff_matrix(record("a", "b", 2, 1) + record("b", "c", 2, 1))
    with pytest.raises(RankingError, match="unknown='even'"):
        nash_average(players, P)
    assert nash_average(players, P, unknown="even").weights.sum() == pytest.approx(1.0)


def flips(games: list[Game], players, pairs) -> bool:
    theta = fit(games, players=players).log_strength
    return any(theta[players.index(i)] - theta[players.index(j)] <= 1e-9 for i, j in pairs)


def test_rank_stability_one_game_flips_a_close_top():
    # A beat B 3-2; otherwise A and B have the same record, so one A win less ties them: 1 is
    # provably the fewest (no removal at all leaves A ahead).
    games = (record("A", "B", 3, 2) + record("A", "C", 3, 0) + record("A", "D", 3, 0) + record("B", "C", 3, 0)
             + record("B", "D", 3, 0) + record("C", "D", 2, 1))
    found = rank_stability(games, top=2)
    assert (found.count, found.pair, found.places) == (1, ("A", "B"), (1, 2))
    rest = list(games)
    rest.remove(found.removed[0])
    assert flips(rest, tuple("ABCD"), [("A", "B")])


def test_rank_stability_greedy_answer_is_the_exact_minimum_by_brute_force():
    games = (record("A", "B", 4, 2) + record("A", "C", 3, 0) + record("A", "D", 3, 0) + record("B", "C", 3, 0)
             + record("B", "D", 3, 0) + record("C", "D", 2, 1))
    found = rank_stability(games, top=3)
    assert (found.count, found.pair) == (2, ("A", "B"))
    assert [c for _, _, c in found.per_pair][0] == 2
    pairs, players = [("A", "B"), ("B", "C")], tuple("ABCD")
    assert not any(flips(games[:i] + games[i + 1:], players, pairs) for i in range(len(games)))
    rest = list(games)
    for g in found.removed:
        rest.remove(g)
    assert flips(rest, players, pairs)


def test_forfeits_are_measured_apart_and_warned_about():
    def matches(a, b, a_wins, b_wins, **how):
        return [Match(a, b, 1.0, **how)] * a_wins + [Match(a, b, 0.0, **how)] * b_wins
    # In play Y beat X and F is the strongest; X reaches the top only through F's forfeits to X.
    records = (matches("Y", "X", 2, 1) + matches("Y", "G", 2, 1) + matches("X", "G", 2, 1) + matches("F", "G", 2, 0)
               + matches("F", "Y", 1, 1) + matches("F", "X", 1, 1)
               + matches("X", "F", 5, 0, status="TIMEOUT", faulty="F") + [Match("F", "X", 0.0, "INVALID", "F")])
    rates = {r.player: r for r in forfeit_rates(records)}
    assert (rates["F"].matches, rates["F"].forfeits) == (12, 6)
    assert rates["F"].timeout_rate == pytest.approx(5 / 12) and rates["F"].invalid_rate == pytest.approx(1 / 12)
    assert rates["X"].forfeit_rate == 0.0 and rates["F"].error_rate == 0.0
    with_, without = ratings_without_forfeits(records)
    assert with_.ranks()["X"] < with_.ranks()["Y"] and without.ranks()["X"] > without.ranks()["Y"]
    warnings = {w.player: w for w in forfeit_dependence_warnings(records)}
    assert set(warnings) == {"X", "F"}
    assert (warnings["X"].rank_with, warnings["X"].rank_without) == (1, 3)
    assert warnings["X"].text.startswith("X: rank 1 counting forfeits, 3 without")
    with pytest.raises(RankingError, match="faulty"):
        forfeit_rates([Match("a", "b", 1.0, "ERROR", faulty="z")])
