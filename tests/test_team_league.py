"""Teams and free-for-alls in the league: team ratings, sides, n-player TrueSkill from the ledger."""

from __future__ import annotations

import numpy as np
import pytest

from ludus.league.api import League, load_config, rebuild_ratings_check, status
from ludus.league.records.ledger import MatchResult, SeatResult, Store
from ludus.league.records.ratings import Rating, RatingTable, TrueSkillParams, rate_1vs1

QUIET = ["log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]


def _match(players, teams, returns, match_id=0):
    from ludus.league.records.ledger import outcomes_from_returns

    outcomes = outcomes_from_returns(returns, teams)
    seats = tuple(SeatResult(seat=i, team=t, player_id=p, episode_return=r, outcome=o)
                  for i, (p, t, r, o) in enumerate(zip(players, teams, returns, outcomes)))
    return MatchResult(match_id=match_id, kind="rating", game_id="simple_tag", seed=0, seats=seats, length=25,
                       started_at=0.0, duration_s=0.0)


def test_a_parameter_shared_team_is_rated_as_one_player():
    params = TrueSkillParams(draw_probability=0.05)
    table = RatingTable(params)
    # Predators (one policy on three seats) tag the prey: a 1-vs-1 win for the predators' policy.
    new = table.update(_match(("pred", "pred", "pred", "prey"), (0, 0, 0, 1), (10.0, 10.0, 10.0, -10.0)))
    expected_winner, expected_loser = rate_1vs1(Rating(params.mu, params.sigma), Rating(params.mu, params.sigma),
                                                False, params)
    assert new["pred"] == expected_winner and new["prey"] == expected_loser


def test_teams_of_different_players_use_trueskill_team_update():
    import trueskill

    params = TrueSkillParams()
    table = RatingTable(params)
    table.update(_match(("a", "b", "c", "d"), (0, 0, 1, 1), (1.0, 1.0, -1.0, -1.0)))
    env = params.env
    (ra, rb), (rc, rd) = env.rate([(env.create_rating(), env.create_rating()),
                                   (env.create_rating(), env.create_rating())], ranks=[0, 1])
    assert table.rating("a").mu == pytest.approx(ra.mu, abs=1e-12)
    assert table.rating("d").sigma == pytest.approx(rd.sigma, abs=1e-12)
    assert isinstance(trueskill.Rating(), trueskill.Rating)


def test_simple_tag_league_has_one_population_per_side_and_team_ratings(tmp_path):
    config = load_config("simple_tag", QUIET + ["iterations=2", "matches_per_iteration=24", "num_envs=12",
                                                "snapshot_every_steps=300"])
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
        # Every training match puts each learner on its own side only, against the other side's pool.
        with Store.open(tmp_path / "run", mode="read") as store:
            for rec in store.iter_matches(kinds=("training",)):
                players = rec.result.player_ids
                assert len(set(players[:3])) == 1, players  # the predators' seats share one player
                if "predators" in players:
                    assert players[:3] == ("predators",) * 3 and not players[3].startswith("predators")
                if "prey" in players:
                    assert players[3] == "prey" and not players[0].startswith("prey")
    finally:
        league.close()
    report = status(tmp_path / "run")
    rated = {m.player_id for m in report.members if m.mu is not None}
    assert any(p.startswith("predators@") for p in rated) and any(p.startswith("prey@") for p in rated)
    assert rebuild_ratings_check(tmp_path / "run").identical

    # The run report's team view: each side's members with their results, one game per match.
    from ludus.evaluation.report import build_report, render_html

    run_report = build_report(tmp_path / "run")
    assert run_report.is_team_game and run_report.sides == ((0, 1, 2), (3,))
    by_side = {side: {r.player_id: r for r in run_report.side_results if r.side == side} for side in (0, 1)}
    assert "predators" in by_side[0] and "prey" in by_side[1]
    assert not any(p.startswith("prey") for p in by_side[0]) and not any(p.startswith("predators") for p in by_side[1])
    with Store.open(tmp_path / "run", mode="read") as store:
        predator_games = sum("predators" in rec.result.player_ids for rec in store.iter_matches())
    assert by_side[0]["predators"].games == predator_games
    for r in run_report.side_results:
        assert r.wins + r.draws + r.losses == r.games
    page = render_html(run_report)
    assert 'id="teams"' in page and 'id="side-0"' in page and 'id="side-1"' in page


def test_three_player_free_for_all_ratings_rebuild_from_the_ledger(tmp_path):
    config = load_config("quickstart", QUIET + ["game=spiel:kuhn_poker(players=3)", "anchors=[random]",
                                                "iterations=3", "matches_per_iteration=48", "num_envs=16",
                                                "snapshot_every_steps=60"])
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
    finally:
        league.close()
    with Store.open(tmp_path / "run", mode="read") as store:
        rating_matches = list(store.iter_matches(kinds=("rating",)))
    assert rating_matches and all(len(set(m.result.player_ids)) == 3 for m in rating_matches)
    check = rebuild_ratings_check(tmp_path / "run")
    assert check.identical and len(check.rebuilt) >= 3


@pytest.mark.slow
def test_three_player_kuhn_learner_beats_random_players(tmp_path):
    from ludus.agents.policy import RandomPolicy
    from ludus.agents.snapshot import policy_from_snapshot
    from ludus.evaluation.evaluate import evaluate_policies

    config = load_config("quickstart", QUIET + [
        "game=spiel:kuhn_poker(players=3)", "anchors=[random]", "iterations=30", "matches_per_iteration=512",
        "num_envs=256", "snapshot_every_steps=5000", "ppo.learning_rate=0.003", "net.hidden=[64,64]"])
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
        last = league.learners["main"].last_snapshot
    finally:
        league.close()
    policy = policy_from_snapshot(tmp_path / "run" / "snapshots" / last, expect_game="spiel:kuhn_poker(players=3)")
    returns = _mean_return_against_random(policy, RandomPolicy(), games=3000)
    assert returns > 0.05, returns  # random players average 0 in a zero-sum game
    # the evaluation layer, duplicate-seated over all three seats, sees the same edge
    (result,) = evaluate_policies("spiel:kuhn_poker(players=3)", policy, {"random": RandomPolicy()},
                                  games_per_opponent=1500, seed=1)
    assert result.games == 1500 and len(result.seat_scores) == 3
    assert result.mean_return > 0.03 and abs(result.mean_return - returns) < 0.1, (result, returns)


def _mean_return_against_random(policy, random_policy, games: int) -> float:
    """Mean return of `policy` in every seat of 3-player Kuhn against two random players."""
    from ludus.games.core import is_over
    from ludus.games.registry import make
    from ludus.agents.policy import ActBatch

    rng = np.random.default_rng(0)
    game = make("spiel:kuhn_poker(players=3)")
    total = 0.0
    for g in range(games):
        seat_of_policy = g % 3
        game.reset(g)
        while not is_over(game):
            (seat,) = game.to_move()
            actor = policy if seat == seat_of_policy else random_policy
            batch = ActBatch(game.observation(seat)[None], game.legal_mask(seat)[None], np.array([seat]))
            game.step({seat: int(actor.act(batch, rng).actions[0])})
        total += float(game.returns()[seat_of_policy])
    return total / games


def test_simple_tag_ends_by_its_rules_at_the_step_limit_and_pays_the_winner_there():
    # The step limit decides the winner and pays the survival bonus, so the end is terminal: a
    # learner that bootstrapped past it (a truncation) would chase V = bonus + gamma V.
    from ludus.games.registry import make_vector
    from ludus.games.builtin.tag import SURVIVAL_BONUS

    games = make_vector("simple_tag", 32, seed=3)
    ts = games.reset(games.seed_source(32))
    rng = np.random.default_rng(0)
    for _ in range(games.spec.max_length):
        ts = games.step(rng.integers(0, games.spec.num_actions, size=(32, 4)))
        if ts.done.any():
            break
    assert ts.done.all() and not ts.truncated.any()
    predators, prey = ts.final_returns[:, 0], ts.final_returns[:, 3]
    untagged = predators < 0  # a predator's return is +10 per tag, or -10 for an episode without one
    assert untagged.any() and (~untagged).any()
    assert np.allclose(predators[untagged], -SURVIVAL_BONUS)
    assert np.all(prey[~untagged] <= -10.0)


def test_simple_tag_global_state_carries_the_clock_and_whether_the_prey_was_tagged():
    # What is left to win depends on the steps left and on whether anyone has tagged yet (the end
    # pays -10 per predator only then), so the state a centralised critic reads holds both.
    from ludus.games.registry import make_vector
    from ludus.games.builtin.tag import CLOCK_FIELDS

    games = make_vector("simple_tag", 32, seed=5)
    ts = games.reset(games.seed_source(32))
    assert games.spec.state_shape == (62 + len(CLOCK_FIELDS),)  # mpe2's state: 3 x 16 + 14
    rng = np.random.default_rng(1)
    tagged = np.zeros(32, dtype=bool)
    for step in range(games.spec.max_length - 1):
        clock = games.global_states()[:, -2:]
        assert np.allclose(clock[:, 0], 1.0 - step / games.spec.max_length)
        assert np.array_equal(clock[:, 1] == 1.0, tagged)
        ts = games.step(rng.integers(0, games.spec.num_actions, size=(32, 4)))
        tagged |= ts.rewards[:, 0] > 0  # a predator's step reward is +10 per tag
        assert not ts.done.any()
    assert tagged.any() and not tagged.all()
    assert np.array_equal(games.global_states()[:, -1] == 1.0, tagged)


@pytest.mark.parametrize("num_obstacles", [2, 0, 3])
def test_simple_tag_world_is_mpe2s_bit_for_bit(num_obstacles):
    # games/builtin/tag.py batches mpe2's simple_tag world in numpy; the same seeds and actions must give
    # mpe2's observations, state and rewards exactly, game after game (32 games at once here,
    # against mpe2 stepped one game at a time through the PettingZoo adapter).
    from ludus.games.adapters.pz import make_pettingzoo_game
    from ludus.games.builtin.tag import SURVIVAL_BONUS, SimpleTagVector

    games = SimpleTagVector(32, max_cycles=25, num_obstacles=num_obstacles)
    seeds = np.array([0, 1, 2**63 + 5, 2**64 - 1] + [int(s) for s in np.random.default_rng(7).integers(0, 2**62, 28)],
                     dtype=np.uint64)
    ts = games.reset(seeds)
    reference = []
    for seed in seeds:
        game = make_pettingzoo_game(f"mpe2.simple_tag_v3(num_good=1,num_adversaries=3,"
                                    f"num_obstacles={num_obstacles},max_cycles=25)")
        game.reset(int(seed))
        reference.append(game)
    rng = np.random.default_rng(3)
    tagged = np.zeros(32, dtype=bool)
    for step in range(25):
        for b, game in enumerate(reference):
            assert np.array_equal(ts.obs[b], np.stack([game.observation(s) for s in range(4)])), (step, b)
            assert np.array_equal(games.global_states()[b, :-2], game.global_state()), (step, b)
        actions = rng.integers(0, 5, size=(32, 4))
        ts = games.step(actions)
        for b, game in enumerate(reference):
            want = game.step({s: int(actions[b, s]) for s in range(4)})
            tagged[b] |= want[0] > 0
            if step == 24 and not tagged[b]:
                want = want + np.float32(SURVIVAL_BONUS) * np.array([-1, -1, -1, 1], np.float32)
            assert np.array_equal(ts.rewards[b], want), (step, b, ts.rewards[b], want)
    assert ts.done.all() and tagged.any()
