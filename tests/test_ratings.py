"""TrueSkill: the exact 1v1 path against the trueskill package, teams, rebuild, placement."""

from __future__ import annotations

import random

import numpy as np
import pytest
import trueskill

from ludus.league.records.ledger import DuplicateMatchError, MatchResult, SeatResult, Store, outcomes_from_returns
from ludus.league.records.ratings import (
    Rating,
    RatingParamsError,
    RatingTable,
    TrueSkillParams,
    conservative,
    ensure_params,
    fit_placement,
    is_rateable,
    load_params,
    match_quality,
    placement_results,
    quality_1vs1,
    quality_1vs1_arrays,
    rate_1vs1,
    rate_1vs1_batch,
    rate_and_record,
    rebuild_ratings,
)


def env_of(params: TrueSkillParams) -> trueskill.TrueSkill:
    return trueskill.TrueSkill(mu=params.mu, sigma=params.sigma, beta=params.beta, tau=params.tau,
                               draw_probability=params.draw_probability)


def match(match_id, players, returns, teams=None, kind="rating", statuses=None) -> MatchResult:
    teams = list(teams) if teams is not None else list(range(len(players)))
    outcomes = outcomes_from_returns(returns, teams)
    statuses = statuses or ["ok"] * len(players)
    return MatchResult(match_id=match_id, kind=kind, game_id="g", seed=match_id, length=10, started_at=0.0,
                       duration_s=0.0, seats=tuple(SeatResult(i, teams[i], p, r, o, status=s) for i, (p, r, o, s)
                                                   in enumerate(zip(players, returns, outcomes, statuses))))


def random_1vs1_cases(rng: random.Random, n: int):
    for _ in range(n):
        sigma1, sigma2 = 10 ** rng.uniform(-2, 2), 10 ** rng.uniform(-2, 2)  # 0.01 .. 100
        mu1 = rng.uniform(-50, 100)
        mu2 = mu1 + rng.gauss(0, 15)
        yield mu1, sigma1, mu2, sigma2, rng.random() < 0.3


@pytest.mark.parametrize("params", [TrueSkillParams(), TrueSkillParams(draw_probability=0.01),
                                    TrueSkillParams(draw_probability=0.6, tau=25 / 300),
                                    TrueSkillParams(mu=0.0, sigma=3.0, beta=1.0, draw_probability=0.2)])
def test_exact_1vs1_equals_trueskill(params):
    env = env_of(params)
    rng = random.Random(1234)
    compared = 0
    for mu1, sigma1, mu2, sigma2, drawn in random_1vs1_cases(rng, 1500):
        try:
            expected = trueskill.rate_1vs1(trueskill.Rating(mu1, sigma1), trueskill.Rating(mu2, sigma2),
                                           drawn=drawn, env=env)
        except FloatingPointError:
            with pytest.raises(FloatingPointError):
                rate_1vs1(Rating(mu1, sigma1), Rating(mu2, sigma2), drawn, params)
            continue
        got = rate_1vs1(Rating(mu1, sigma1), Rating(mu2, sigma2), drawn, params)
        for r_got, r_exp in zip(got, expected):
            assert abs(r_got.mu - r_exp.mu) < 1e-9 and abs(r_got.sigma - r_exp.sigma) < 1e-9
        compared += 1
    assert compared > 1400
    # a hopeless upset: trueskill raises, and so do we
    with pytest.raises(FloatingPointError):
        trueskill.rate_1vs1(trueskill.Rating(0, 1), trueskill.Rating(300, 1), env=env)
    with pytest.raises(FloatingPointError):
        rate_1vs1(Rating(0, 1), Rating(300, 1), False, params)


def test_batch_1vs1_matches_scalar_and_trueskill():
    params = TrueSkillParams()
    env = env_of(params)
    cases = np.array([c for c in random_1vs1_cases(random.Random(7), 2000)], dtype=np.float64)
    mu1, s1, mu2, s2, drawn = cases.T
    out = rate_1vs1_batch(mu1, s1, mu2, s2, drawn.astype(bool), params)
    for k in range(0, 2000, 10):
        a, b = rate_1vs1(Rating(mu1[k], s1[k]), Rating(mu2[k], s2[k]), bool(drawn[k]), params)
        np.testing.assert_allclose([out[0][k], out[1][k], out[2][k], out[3][k]], [a.mu, a.sigma, b.mu, b.sigma],
                                   rtol=1e-12, atol=1e-12)
        ea, eb = trueskill.rate_1vs1(trueskill.Rating(mu1[k], s1[k]), trueskill.Rating(mu2[k], s2[k]),
                                     drawn=bool(drawn[k]), env=env)
        assert abs(out[0][k] - ea.mu) < 1e-9 and abs(out[3][k] - eb.sigma) < 1e-9
    with pytest.raises(FloatingPointError):
        rate_1vs1_batch([0.0, 25.0], [1.0, 8.0], [300.0, 25.0], [1.0, 8.0], [False, False], params)


def test_table_1vs1_uses_seat_outcomes():
    params = TrueSkillParams()
    env = env_of(params)
    table = RatingTable(params)
    table.update(match(1, ["a", "b"], [1.0, -1.0]))
    table.update(match(2, ["b", "c"], [-1.0, 1.0]))  # loser in seat 0
    table.update(match(3, ["c", "a"], [0.0, 0.0]))   # draw
    a, b, c = (env.create_rating() for _ in range(3))
    a, b = trueskill.rate_1vs1(a, b, env=env)
    c, b = trueskill.rate_1vs1(c, b, env=env)
    c, a = trueskill.rate_1vs1(c, a, drawn=True, env=env)
    for pid, expected in (("a", a), ("b", b), ("c", c)):
        got = table.rating(pid)
        assert abs(got.mu - expected.mu) < 1e-9 and abs(got.sigma - expected.sigma) < 1e-9


def test_teams_and_free_for_all_go_through_trueskill_rate():
    params = TrueSkillParams(draw_probability=0.05)
    env = env_of(params)
    table = RatingTable(params)
    # 2v2: seats 0 and 2 are team 0
    team_match = match(1, ["a", "b", "c", "d"], [1.0, -1.0, 1.0, -1.0], teams=[0, 1, 0, 1])
    new = table.update(team_match)
    r = env.create_rating
    (ea, ec), (eb, ed) = env.rate([(r(), r()), (r(), r())], ranks=[0, 1])
    for pid, expected in zip("acbd", (ea, ec, eb, ed)):
        assert new[pid] == Rating(expected.mu, expected.sigma) == table.rating(pid)
    # three-player free-for-all with a tie for first
    ffa = match(2, ["a", "e", "b"], [2.0, 2.0, 0.0])
    new = table.update(ffa)
    start = [trueskill.Rating(ea.mu, ea.sigma), r(), trueskill.Rating(eb.mu, eb.sigma)]
    (xa,), (xe,), (xb,) = env.rate([(start[0],), (start[1],), (start[2],)], ranks=[-1.0, -1.0, -0.0])
    assert [new[p] for p in "aeb"] == [Rating(x.mu, x.sigma) for x in (xa, xe, xb)]
    assert xe.mu > params.mu and xb.mu < eb.mu  # sanity: the tied winner rises, the loser falls


def test_unrateable_matches_change_nothing():
    table = RatingTable()
    assert not is_rateable(match(1, ["a", "a"], [1.0, -1.0]))                          # self-play
    assert not is_rateable(match(2, ["a", "b"], [0.0, 0.0], statuses=["error", "timeout"]))
    assert not is_rateable(match(3, ["a", "b"], [1.0, 1.0], teams=[0, 0]))             # one team
    assert is_rateable(match(4, ["a", "b"], [-1.0, 1.0], statuses=["timeout", "ok"]))  # forfeit counts
    for m in (match(1, ["a", "a"], [1.0, -1.0]), match(3, ["a", "b"], [1.0, 1.0], teams=[0, 0])):
        assert table.update(m) == {}
    assert len(table) == 0


def test_rebuild_from_ledger_equals_live_table_bit_for_bit(tmp_path):
    params = TrueSkillParams(draw_probability=0.15)
    rng = random.Random(5)
    players = [f"p{i}" for i in range(12)]
    live = RatingTable(params)
    match_id = 0
    with Store.open(tmp_path) as store:
        ensure_params(store, params)
        for _ in range(20):
            batch = []
            for _ in range(15):
                kind = rng.choice(["rating", "rating", "training"])
                if rng.random() < 0.8:
                    a, b = rng.sample(players, 2)
                    batch.append(match(match_id, [a, b], [rng.choice([-1.0, 0.0, 1.0]), 0.0], kind=kind))
                else:
                    trio = rng.sample(players, 3)
                    batch.append(match(match_id, trio, [rng.choice([0.0, 1.0, 2.0]) for _ in trio], kind=kind))
                match_id += 1
            rate_and_record(store, live, batch)
        assert store.count_matches(kinds=["rating"]) > 150
    with Store.open(tmp_path, mode="read") as reader:
        stored_params = load_params(reader)
        assert stored_params == params
        rebuilt = rebuild_ratings(reader, stored_params)
        latest = reader.latest_ratings()
    assert rebuilt.as_dict() == live.as_dict()  # exact float equality
    assert {p: Rating(x.mu, x.sigma) for p, x in latest.items()} == live.as_dict()
    # a JSON round trip is exact too
    assert RatingTable.from_json(live.to_json()).as_dict() == live.as_dict()


def test_rate_and_record_restores_table_when_the_batch_is_refused(tmp_path):
    table = RatingTable()
    with Store.open(tmp_path) as store:
        rate_and_record(store, table, [match(1, ["a", "b"], [1.0, -1.0])])
        before = table.as_dict()
        with pytest.raises(DuplicateMatchError):
            rate_and_record(store, table, [match(2, ["a", "c"], [1.0, -1.0]), match(3, ["c", "b"], [1.0, -1.0]),
                                           match(1, ["a", "b"], [1.0, -1.0])])
        assert table.as_dict() == before and "c" not in table
        assert store.ratings_history() and max(x.seq for x in store.ratings_history()) == 1


def test_params_are_validated_and_pinned_in_the_ledger(tmp_path):
    with pytest.raises(RatingParamsError, match="draw_probability"):
        TrueSkillParams(draw_probability=0.0)
    with pytest.raises(RatingParamsError):
        TrueSkillParams(sigma=-1.0)
    params = TrueSkillParams(draw_probability=0.02)
    assert TrueSkillParams.from_json(params.to_json()) == params
    assert abs(params.draw_margin_1vs1 - trueskill.calc_draw_margin(0.02, 2, env_of(params))) == 0.0
    with Store.open(tmp_path) as store:
        assert load_params(store) is None
        assert ensure_params(store, params) == params
        assert ensure_params(store, params) == params
        with pytest.raises(RatingParamsError, match="was rated with"):
            ensure_params(store, TrueSkillParams())


def test_quality_and_conservative():
    params = TrueSkillParams()
    env = env_of(params)
    rng = random.Random(3)
    for _ in range(50):
        r1, r2 = Rating(rng.uniform(0, 50), rng.uniform(0.5, 9)), Rating(rng.uniform(0, 50), rng.uniform(0.5, 9))
        expected = trueskill.quality_1vs1(trueskill.Rating(r1.mu, r1.sigma), trueskill.Rating(r2.mu, r2.sigma), env=env)
        assert abs(quality_1vs1(r1, r2, params) - expected) < 1e-12
        assert abs(match_quality([[r1], [r2]], params) - expected) < 1e-12
        assert abs(quality_1vs1_arrays(np.array([r1.mu]), r1.sigma, r2.mu, np.array([r2.sigma]), params)[0]
                   - expected) < 1e-12
    teams = [[Rating(25, 3), Rating(30, 2)], [Rating(27, 4), Rating(26, 1)], [Rating(20, 8)]]
    expected = env.quality([tuple(trueskill.Rating(r.mu, r.sigma) for r in t) for t in teams])
    assert match_quality(teams, params) == pytest.approx(expected, abs=1e-12)
    assert conservative(25.0, 25 / 3) == pytest.approx(0.0)
    assert Rating(30.0, 2.0).conservative == 24.0
    table = RatingTable(params)
    table.update(match(1, ["x", "y"], [1.0, -1.0]))
    assert [p for p, _ in table.leaderboard()] == ["x", "y"]


def test_fit_placement_against_frozen_ratings():
    params = TrueSkillParams()
    env = env_of(params)
    frozen = {"weak": Rating(15.0, 1.0), "mid": Rating(25.0, 1.5), "strong": Rating(35.0, 2.0)}
    games = [("weak", 1.0), ("mid", 1.0), ("strong", 0.0), ("mid", 0.5), ("strong", 1.0), ("weak", 1.0)]
    # one pass = sequential TrueSkill updates of the newcomer only
    newcomer = env.create_rating()
    for opponent, outcome in games:
        opp = trueskill.Rating(frozen[opponent].mu, frozen[opponent].sigma)
        if outcome == 1.0:
            newcomer, _ = trueskill.rate_1vs1(newcomer, opp, env=env)
        elif outcome == 0.0:
            _, newcomer = trueskill.rate_1vs1(opp, newcomer, env=env)
        else:
            newcomer, _ = trueskill.rate_1vs1(newcomer, opp, drawn=True, env=env)
    one_pass = fit_placement(games, frozen, params, max_iterations=1)
    assert abs(one_pass.mu - newcomer.mu) < 1e-9 and abs(one_pass.sigma - newcomer.sigma) < 1e-9
    # iterating to the EP fixed point removes the dependence on game order
    converged = fit_placement(games, frozen, params)
    shuffled = fit_placement(list(reversed(games)), frozen, params)
    assert abs(converged.mu - shuffled.mu) < 1e-7 and abs(converged.sigma - shuffled.sigma) < 1e-7
    assert frozen["mid"] == Rating(25.0, 1.5)  # opponents untouched
    # a newcomer that beats everyone many times places above the strongest frozen player
    dominant = fit_placement([(o, 1.0) for o in frozen] * 10, frozen, params)
    assert dominant.mu > 35.0 and dominant.sigma < params.sigma
    # results can be read straight from ledger matches; a RatingTable works as the frozen pool
    table = RatingTable(params)
    table.update(match(1, ["weak", "strong"], [-1.0, 1.0]))
    ms = [match(2, ["new", "weak"], [1.0, -1.0]), match(3, ["strong", "new"], [0.0, 0.0]),
          match(4, ["strong", "weak"], [1.0, -1.0])]
    assert placement_results(ms, "new") == [("weak", 1.0), ("strong", 0.5)]
    assert fit_placement(placement_results(ms, "new"), table, params).sigma < params.sigma
    with pytest.raises(ValueError):
        fit_placement([("weak", 0.7)], frozen, params)
