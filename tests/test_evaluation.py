"""Evaluation: a checkpoint against a run's population, exploitability, meta-game and exploiter probe.

One small tic-tac-toe league run (quickstart, 2 iterations) is shared by the module.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyspiel
import pytest
import torch

from ludus.agents.bots.builtin import ScriptedBot, make_bot
from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import RandomPolicy
from ludus.agents.snapshot import Lineage, SnapshotError, save_snapshot
from ludus.agents.torch_policy import TorchPolicy
from ludus.evaluation.evaluate import evaluate_checkpoint, evaluate_policies, paired_assignments
from ludus.agents.solvers.exploitability import (SpielPolicyAdapter, aggregate_mixture, exploitability, exploitability_of,
                                   nash_conv, nash_mixture)
from ludus.evaluation.metagame import (PayoffMatrix, payoff_matrix_from_ledger, solve_metagame,
                                 three_cycles)
from ludus.evaluation.probe import ProbeConfig, probe_checkpoint
from ludus.games.registry import make, spec as game_spec
from ludus.league.api import League, load_config, stored_ratings
from ludus.league.records.ledger import Store
from ludus.cli import main

KUHN = "spiel:kuhn_poker"
SMALL_TTT = Path(__file__).parent / "fixtures" / "small_tic_tac_toe.yaml"
"""The small league the shared run is made of (the quickstart preset before it trained to learn)."""
LEDUC = "spiel:leduc_poker"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("evaluation") / "run"
    league = League.create(load_config(str(SMALL_TTT), ["iterations=2", "log.progress=false"]), path)
    try:
        league.run()
    finally:
        league.close()
    return path


@pytest.fixture(scope="module")
def report(run_dir):
    """main@1 against every frozen member including anchors (and itself: main@1 is a member)."""
    return evaluate_checkpoint(run_dir / "snapshots" / "main@1", run_dir, games_per_opponent=40,
                               include_anchors=True, seed=0)


def _tree_digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() + f":{p.stat().st_mtime_ns}"
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in dst.iterdir():
        path.chmod(0o644)
    return dst


# ---------------------------------------------------------------------------------------------
# A checkpoint against the population


def test_paired_seats_and_seeds():
    assignments = paired_assignments("me", ["a", "b"], games_per_opponent=5, num_players=2, seed=7)
    assert len(assignments) == 12  # 5 rounded up to 3 seeds x 2 seats, per opponent
    for opponent in ("a", "b"):
        mine = [x for x in assignments if opponent in x.players]
        seeds = [x.seed for x in mine]
        assert all(seeds.count(s) == 2 for s in seeds)  # every seed from both seats
        assert {x.players.index("me") for x in mine if x.seed == seeds[0]} == {0, 1}
    # common random numbers: the same seeds against every opponent
    assert sorted(x.seed for x in assignments if "a" in x.players) == sorted(x.seed for x in assignments
                                                                             if "b" in x.players)
    assert len({x.match_id for x in assignments}) == len(assignments)


def test_report_covers_every_frozen_member(report, run_dir):
    frozen = {"anchor:random", "anchor:perfect", "main@0", "main@1"}
    assert {r.opponent for r in report.opponents} == frozen
    for r in report.opponents:
        assert r.games == 40 and r.wins + r.draws + r.losses == 40
        assert r.lower <= r.score <= r.upper
        assert len(r.seat_scores) == 2
        assert r.score == pytest.approx((r.wins + r.draws / 2) / r.games)
    assert report.total_games == 160
    assert report.lower <= report.score <= report.upper
    json.dumps(report.to_json())


def test_checkpoint_against_a_copy_of_itself_scores_half(report):
    (itself,) = [r for r in report.opponents if r.opponent == "main@1"]
    assert itself.lower <= 0.5 <= itself.upper


def test_perfect_anchor_is_never_beaten(report):
    (perfect,) = [r for r in report.opponents if r.opponent == "anchor:perfect"]
    assert perfect.wins == 0


def test_placement_uses_frozen_ratings_and_ranks(report, run_dir):
    ratings = stored_ratings(run_dir)
    rated_opponents = [r for r in report.opponents if r.opponent in ratings]
    assert report.placement is not None
    assert report.placement_games == sum(r.games for r in rated_opponents)
    assert report.rated_members == len(ratings)
    better = sum(r.conservative > report.placement.conservative for r in ratings.values())
    assert report.rank == better + 1
    for r in rated_opponents:
        assert (r.opponent_mu, r.opponent_sigma) == (ratings[r.opponent].mu, ratings[r.opponent].sigma)
    assert stored_ratings(run_dir) == ratings  # the frozen ratings are not changed


def test_evaluation_is_deterministic_and_never_writes_the_run(run_dir):
    before = _tree_digest(run_dir)
    first = evaluate_checkpoint(run_dir / "snapshots" / "main@0", run_dir, games_per_opponent=6, seed=3)
    second = evaluate_checkpoint(run_dir / "snapshots" / "main@0", run_dir, games_per_opponent=6, seed=3)
    assert first.opponents == second.opponents and first.placement == second.placement
    assert {r.opponent for r in first.opponents} == {"main@0", "main@1"}  # no anchors unless asked
    assert _tree_digest(run_dir) == before


def test_evaluation_works_while_the_run_trains(run_dir, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(run_dir, live)
    league = League.resume(live)  # holds the writer lock, ledger in WAL mode
    try:
        league.step()
        result = evaluate_checkpoint(live / "snapshots" / "main@1", live, games_per_opponent=4, seed=1)
        assert result.run_iteration == 3
        assert sum(r.games for r in result.opponents) == result.total_games > 0
    finally:
        league.close()


def test_perfect_player_is_never_beaten_by_random_or_mcts():
    spec = game_spec("tic_tac_toe")
    results = evaluate_policies("tic_tac_toe", make_bot("perfect", spec),
                                {"random": make_bot("random", spec), "mcts": make_bot("mcts-25", spec)},
                                games_per_opponent=12, seed=0)
    assert {r.opponent for r in results} == {"random", "mcts"}
    for r in results:
        assert r.games == 12 and r.losses == 0
    (random_result,) = [r for r in results if r.opponent == "random"]
    assert random_result.wins >= 8  # perfect play beats a random mover most of the time


def test_cli_evaluate_json(run_dir, capsys):
    code = main(["evaluate", str(run_dir / "snapshots" / "main@1"), "--against", str(run_dir), "--games", "4",
                 "--anchors", "--json", "--seed", "2"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    evaluation = data["evaluation"]
    assert evaluation["games_per_opponent"] == 4 and len(evaluation["opponents"]) == 4
    assert evaluation["placement_mu"] is not None and evaluation["rank"] >= 1


def test_cli_evaluate_table(run_dir, capsys):
    assert main(["evaluate", str(run_dir / "snapshots" / "main@0"), "--against", str(run_dir), "--games", "2"]) == 0
    out = capsys.readouterr().out
    assert "95% interval" in out and "main@1" in out and "overall: 4 games" in out


def _assert_one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("ludus: error:")
    for needle in needles:
        assert needle in err


def test_corrupt_checkpoint_is_refused_with_one_line(run_dir, tmp_path, capsys):
    bad = _writable_copy(run_dir / "snapshots" / "main@1", tmp_path / "bad")
    weights = bad / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(SnapshotError):
        evaluate_checkpoint(bad, run_dir, games_per_opponent=2)
    assert main(["evaluate", str(bad), "--against", str(run_dir)]) == 2
    _assert_one_line_error(capsys, "hash mismatch")


def test_checkpoint_of_another_game_is_refused(run_dir, tmp_path, capsys):
    spec = game_spec("connect_four")
    other = tmp_path / "c4"
    save_snapshot(ActorCritic(spec, NetConfig(hidden=(8,))), spec, NetConfig(hidden=(8,)), other, Lineage())
    assert main(["evaluate", str(other), "--against", str(run_dir)]) == 2
    _assert_one_line_error(capsys, "connect_four", "tic_tac_toe")
    assert main(["evaluate", str(tmp_path / "missing"), "--against", str(run_dir)]) == 2
    _assert_one_line_error(capsys, "missing")


# ---------------------------------------------------------------------------------------------
# Exploitability


def _uniform_kuhn_snapshot(directory: Path) -> Path:
    spec = game_spec(KUHN)
    config = NetConfig(hidden=(16,))
    net = ActorCritic(spec, config)
    with torch.no_grad():  # zero policy head: equal logits, the uniform policy
        net.policy_head.weight.zero_()
        net.policy_head.bias.zero_()
    save_snapshot(net, spec, config, directory, Lineage(role="test"))
    return directory


def test_uniform_kuhn_policy_nash_conv_is_eleven_twelfths(tmp_path, capsys):
    result = exploitability_of(RandomPolicy(), KUHN)
    assert result.nash_conv == pytest.approx(11 / 12, abs=1e-12)
    assert result.exploitability == pytest.approx(0.458333, abs=1e-6)
    assert sum(result.player_improvements) == pytest.approx(result.nash_conv)
    assert exploitability(KUHN, RandomPolicy()) == pytest.approx(11 / 24, abs=1e-12)
    snapshot = _uniform_kuhn_snapshot(tmp_path / "uniform")
    assert exploitability_of(snapshot).nash_conv == pytest.approx(11 / 12, abs=1e-6)
    assert main(["evaluate", str(snapshot), "--exploitability", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exploitability"]["exploitability"] == pytest.approx(0.458333, abs=1e-6)


def test_leduc_uniform_exploitability_matches_reference():
    assert exploitability(LEDUC, RandomPolicy()) == pytest.approx(2.373611, abs=1e-5)


def test_adapter_scores_the_function_that_played():
    """The adapter's probabilities equal the net's masked softmax on the observations SpielGame gave it."""
    for game_id in (KUHN, LEDUC):
        spec = game_spec(game_id)
        torch.manual_seed(0)
        net = ActorCritic(spec, NetConfig(hidden=(32,)))
        with torch.no_grad():
            net.policy_head.weight.mul_(300.0)  # far from uniform
        adapter = SpielPolicyAdapter(game_id, TorchPolicy(net))
        rng = np.random.default_rng(0)
        checked = 0
        for seed in range(20):
            game = make(game_id)
            game.reset(seed)
            while game.to_move():
                (seat,) = game.to_move()
                obs, mask = game.observation(seat), game.legal_mask(seat)
                with torch.no_grad():
                    logits, _ = net(torch.from_numpy(obs[None]), torch.from_numpy(mask[None]))
                expected = torch.softmax(logits.double(), dim=-1).numpy()[0]
                got = adapter.action_probabilities(game.state)
                assert set(got) == set(np.nonzero(mask)[0].tolist())
                for action, p in got.items():
                    assert p == pytest.approx(expected[action], abs=1e-6)
                checked += 1
                game.step({seat: int(rng.choice(np.nonzero(mask)[0]))})
        assert checked > 40
        # and the tabular form is the same policy
        table = adapter.to_tabular()
        state = table.states[-1]
        assert np.allclose([table.action_probabilities(state)[a] for a in state.legal_actions()],
                           [adapter.action_probabilities(state)[a] for a in state.legal_actions()])


def _random_tabular(game, rng):
    from open_spiel.python import policy as spiel_policy

    table = spiel_policy.TabularPolicy(game)
    x = rng.random(table.action_probability_array.shape) * table.legal_actions_mask
    table.action_probability_array[:] = x / x.sum(axis=1, keepdims=True)
    return table


def test_aggregate_mixture_matches_openspiel_policy_aggregator():
    from open_spiel.python.algorithms.policy_aggregator import PolicyAggregator

    game = pyspiel.load_game("kuhn_poker")
    rng = np.random.default_rng(1)
    tables = [_random_tabular(game, rng) for _ in range(3)]
    weights = [0.2, 0.5, 0.3]
    mine = aggregate_mixture(KUHN, tables, weights)
    reference = PolicyAggregator(game).aggregate([0, 1], [tables, tables], [weights, weights])
    for state in mine.states:
        expected = reference.action_probabilities(state)
        got = mine.action_probabilities(state)
        for action in state.legal_actions():
            assert got[action] == pytest.approx(expected[action], abs=1e-12)


def test_aggregate_mixture_realises_the_mixture():
    """Against any fixed opponent, the aggregated policy earns the weighted mean of its parts'
    values; a plain (not reach-weighted) average of the tables does not."""
    from open_spiel.python import policy as spiel_policy
    from open_spiel.python.algorithms.expected_game_score import policy_value

    game = pyspiel.load_game("leduc_poker")
    rng = np.random.default_rng(2)
    parts = [_random_tabular(game, rng) for _ in range(2)]
    opponent = _random_tabular(game, rng)
    weights = [0.7, 0.3]
    mixture = aggregate_mixture(LEDUC, parts, weights)
    root = game.new_initial_state()
    value = policy_value(root, [mixture, opponent])[0]
    expected = sum(w * policy_value(root, [p, opponent])[0] for w, p in zip(weights, parts))
    assert value == pytest.approx(expected, abs=1e-9)
    naive = spiel_policy.TabularPolicy(game)
    naive.action_probability_array[:] = sum(w * p.action_probability_array for w, p in zip(weights, parts))
    assert abs(policy_value(root, [naive, opponent])[0] - expected) > 1e-4
    # and exploitability accepts the aggregated table
    assert nash_conv(LEDUC, mixture) > 0


def test_exploitability_refuses_games_it_cannot_measure():
    from ludus.agents.solvers.exploitability import ExploitabilityError

    with pytest.raises(ExploitabilityError, match="spiel:kuhn_poker"):
        exploitability("tic_tac_toe", RandomPolicy())
    with pytest.raises(ExploitabilityError, match="probe"):
        exploitability("spiel:connect_four", RandomPolicy())
    first_legal = ScriptedBot(lambda obs, mask, seat, history, rng: int(np.argmax(mask)))
    with pytest.raises(ExploitabilityError, match="action probabilities"):
        exploitability(KUHN, first_legal)


# ---------------------------------------------------------------------------------------------
# Meta-game


def test_rock_paper_scissors_meta_nash_is_uniform():
    rps = PayoffMatrix.from_scores(["rock", "paper", "scissors"], [[0.5, 0, 1], [1, 0.5, 0], [0, 1, 0.5]], games=50)
    meta = solve_metagame(rps)
    assert np.allclose(meta.nash, 1 / 3, atol=1e-6)
    assert np.allclose(meta.alpharank, 1 / 3, atol=1e-6)
    assert meta.nash_value == pytest.approx(0.0, abs=1e-9)
    assert meta.num_cycles == 1
    (cycle,) = meta.cycles
    assert cycle.players == ("rock", "scissors", "paper") and cycle.margin == pytest.approx(0.5)


def test_transitive_population_has_a_pure_nash_and_no_cycles():
    scores = [[0.5, 0.8, 0.9], [0.2, 0.5, 0.7], [0.1, 0.3, 0.5]]
    meta = solve_metagame(PayoffMatrix.from_scores(["best", "mid", "worst"], scores, games=100))
    assert np.allclose(meta.nash, [1, 0, 0], atol=1e-9)
    assert meta.alpharank[0] > 0.9
    assert meta.num_cycles == 0 and meta.cycles == ()


def test_nash_mixture_of_a_non_symmetric_zero_sum_game():
    x, value = nash_mixture(np.array([[3.0, -1.0], [-2.0, 1.0]]))
    assert np.allclose(x, [3 / 7, 4 / 7]) and value == pytest.approx(1 / 7)


def test_cycles_only_from_played_pairs_and_limited():
    n = 7
    scores = np.full((n, n), 0.5)
    for i in range(n):  # i beats i+1 .. i+3 (mod 7): a regular tournament full of cycles
        for k in (1, 2, 3):
            scores[i, (i + k) % n], scores[(i + k) % n, i] = 0.8, 0.2
    matrix = PayoffMatrix.from_scores([f"p{i}" for i in range(n)], scores)
    cycles, count = three_cycles(matrix, limit=5)
    assert count == 14 and len(cycles) == 5  # a regular 7-tournament has 14 cyclic triangles
    unplayed = PayoffMatrix(matrix.players, matrix.score_sum, np.zeros_like(matrix.games))
    assert three_cycles(unplayed)[1] == 0


def test_payoff_matrix_from_the_ledger(run_dir):
    matrix = payoff_matrix_from_ledger(run_dir)
    assert matrix.players == ("anchor:random", "anchor:perfect", "main@0", "main@1")
    assert np.array_equal(matrix.games, matrix.games.T)
    played = matrix.games > 0
    assert np.allclose((matrix.score + matrix.score.T)[played], 1.0)
    with Store.open(run_dir, mode="read") as store:
        rating_matches = store.count_matches(kinds=("rating",))
    assert matrix.games.sum() / 2 == rating_matches  # every rating match is one frozen pair
    with_learner = payoff_matrix_from_ledger(run_dir, include_learners=True)
    assert "main" in with_learner.players and with_learner.games.sum() > matrix.games.sum()


# ---------------------------------------------------------------------------------------------
# Exploiter probe


def test_exploiter_probe_trains_and_reports(run_dir, capsys):
    config = ProbeConfig(steps=1500, matches_per_update=128, num_envs=64, eval_games=60)
    result = probe_checkpoint(run_dir / "snapshots" / "main@0", seed=0, config=config)
    assert result.steps >= 1500 and result.updates >= 2 and result.training_games == 128 * result.updates
    for measured in (result.initial, result.final):
        assert measured.games == 60 and measured.wins + measured.draws + measured.losses == 60
        assert measured.lower <= measured.score <= measured.upper
    assert main(["evaluate", str(run_dir / "snapshots" / "main@0"), "--probe-steps", "300", "--json"]) == 0
    probe = json.loads(capsys.readouterr().out)["probe"]
    assert probe["steps"] >= 300 and probe["final"]["games"] == 400


@pytest.mark.slow
def test_exploiter_probe_beats_a_weak_checkpoint(run_dir):
    result = probe_checkpoint(run_dir / "snapshots" / "main@0", steps=20_000, seed=0)
    assert result.final.lower > result.initial.upper
