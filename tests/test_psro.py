"""PSRO on Kuhn poker: the exact meta-game, its Nash mixture, its cache, and the league that uses them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import RandomPolicy
from ludus.agents.solvers.exploitability import exploitability, nash_mixture, projected_replicator_dynamics
from ludus.agents.snapshot import Lineage, save_snapshot
from ludus.evaluation.league_hooks import output_exploitability
from ludus.games.registry import spec as game_spec
from ludus.league.api import League, load_config
from ludus.league.records.ledger import Store
from ludus.league.records.population import Member
from ludus.league.psro import (CACHE_FILE, MetaSolver, PSROError, clear_payoff_caches, league_output_policy, meta_game,
                         meta_strategy, payoff_cache)

KUHN = "spiel:kuhn_poker"
UNIFORM_EXPLOITABILITY = 11 / 24


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_payoff_caches()
    yield
    clear_payoff_caches()


def _snapshot(directory: Path, logit_bias: tuple[float, float]) -> Member:
    """A net whose policy ignores the observation: softmax(logit_bias) over the legal actions."""
    spec = game_spec(KUHN)
    config = NetConfig(hidden=(8,))
    torch.manual_seed(0)
    net = ActorCritic(spec, config)
    with torch.no_grad():
        net.policy_head.weight.zero_()
        net.policy_head.bias.copy_(torch.tensor(logit_bias))
    ref = save_snapshot(net, spec, config, directory, Lineage(role="test"))
    return Member(directory.name, "snapshot", "test", snapshot_path=str(directory), snapshot_id=ref.snapshot_id)


@pytest.fixture
def players(tmp_path) -> dict[str, Member]:
    """Random anchor, a uniform net, an always-bet net and an always-pass net (both seats: bet or
    call always / check or fold always; Kuhn's two actions are legal everywhere)."""
    return {
        "random": Member("anchor:random", "anchor", "anchor", bot="random"),
        "uniform": _snapshot(tmp_path / "uniform", (0.0, 0.0)),
        "bet": _snapshot(tmp_path / "bet", (-60.0, 60.0)),
        "pass": _snapshot(tmp_path / "pass", (60.0, -60.0)),
    }


def test_exact_entries_match_hand_computed_values(players, tmp_path):
    spec = game_spec(KUHN)
    order = ["random", "uniform", "bet", "pass"]
    game = meta_game(spec, [players[k] for k in order], tmp_path)
    # Uniform vs uniform (the random bot and the zero-logit net are the same policy): seat 0 earns
    # 1/2 * 1/2 (bet, the opponent folds half the time) - 1/2 * 1/4 (check, bet into, fold half) = 1/8.
    returns = payoff_cache(spec.id, tmp_path).returns
    assert returns[("bot:random", players["uniform"].snapshot_id)] == pytest.approx((1 / 8, -1 / 8), abs=1e-12)
    # Always-bet vs uniform: on seat 0 it wins the ante when the opponent folds (1/2) and the
    # showdown for 2 is even: 1/2; on seat 1 it bets after a check (1/2) and the uniform player
    # folds half the time: 1/4. Symmetrised 3/8. Always-bet vs always-pass wins 1 on both seats.
    # Always-pass vs uniform: checks then folds to a bet (1/2) on seat 0, folds to a bet (1/2) on seat 1.
    expected = np.array([
        [0.0, 0.0, -3 / 8, 1 / 2],
        [0.0, 0.0, -3 / 8, 1 / 2],
        [3 / 8, 3 / 8, 0.0, 1.0],
        [-1 / 2, -1 / 2, -1.0, 0.0],
    ])
    np.testing.assert_allclose(game.payoff, expected, atol=1e-9)
    # Always-bet dominates the others: the Nash mixture is pure.
    np.testing.assert_allclose(game.nash, [0, 0, 1, 0], atol=1e-9)
    assert game.players == ("anchor:random", "uniform", "bet", "pass")


def test_payoff_is_antisymmetric_and_follows_member_order(players, tmp_path):
    spec = game_spec(KUHN)
    members = [players[k] for k in ("uniform", "bet", "pass", "random")]
    game = meta_game(spec, members, tmp_path)
    np.testing.assert_allclose(game.payoff, -game.payoff.T, atol=1e-12)
    assert np.all(np.diag(game.payoff) == 0.0)
    permutation = [2, 0, 3, 1]
    permuted = meta_game(spec, [members[i] for i in permutation], tmp_path)
    np.testing.assert_array_equal(permuted.payoff, game.payoff[np.ix_(permutation, permutation)])


def test_nash_of_literal_matrices():
    rock_paper_scissors = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    x, value = nash_mixture(rock_paper_scissors)
    np.testing.assert_allclose(x, [1 / 3, 1 / 3, 1 / 3], atol=1e-9)
    assert value == pytest.approx(0.0, abs=1e-9)
    # Biased RPS (paper beats rock by 2): the equilibrium is (1/4, 1/4, 1/2) over (R, P, S).
    biased = np.array([[0, -2, 1], [2, 0, -1], [-1, 1, 0]], dtype=float)
    x, _ = nash_mixture(biased)
    np.testing.assert_allclose(x, [1 / 4, 1 / 4, 1 / 2], atol=1e-9)


def test_prd_of_literal_matrices():
    rock_paper_scissors = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    np.testing.assert_allclose(projected_replicator_dynamics(rock_paper_scissors, 0.05), [1 / 3] * 3, atol=1e-3)
    # Biased RPS: the replicator's time average approaches the Nash mixture (1/4, 1/4, 1/2).
    biased = np.array([[0, -2, 1], [2, 0, -1], [-1, 1, 0]], dtype=float)
    np.testing.assert_allclose(projected_replicator_dynamics(biased, 0.01), [1 / 4, 1 / 4, 1 / 2], atol=0.02)
    # A dominant strategy takes everything but the exploration floor gamma / n of the others.
    dominant = np.array([[0, 1, 1], [-1, 0, 0], [-1, 0, 0]], dtype=float)
    x = projected_replicator_dynamics(dominant, 0.3)
    np.testing.assert_allclose(x, [0.8, 0.1, 0.1], atol=1e-3)
    with pytest.raises(Exception, match="exploration"):
        projected_replicator_dynamics(dominant, 1.0)


def test_prd_meta_strategy_keeps_weight_where_the_lp_is_sparse(players, tmp_path):
    spec = game_spec(KUHN)
    members = [players["random"], players["bet"], players["pass"]]
    game = meta_game(spec, members, tmp_path, solver=MetaSolver("prd", 0.3))
    np.testing.assert_allclose(game.nash, [0.0, 1.0, 0.0], atol=1e-9)  # always-bet dominates here
    assert np.all(game.strategy >= 0.1 - 1e-12) and game.strategy[1] == pytest.approx(0.8, abs=1e-3)
    np.testing.assert_array_equal(meta_strategy(spec, members, tmp_path, MetaSolver("prd", 0.3)), game.strategy)
    # The output policy plays the solver's mixture, not the LP's.
    prd = exploitability(KUHN, league_output_policy(spec, members, tmp_path, solver=MetaSolver("prd", 0.3)))
    nash = exploitability(KUHN, league_output_policy(spec, members, tmp_path))
    assert prd != pytest.approx(nash, abs=1e-3)


def test_cache_computes_each_pair_once_and_survives_a_restart(players, tmp_path):
    spec = game_spec(KUHN)
    first = [players[k] for k in ("random", "uniform", "bet")]
    game = meta_game(spec, first, tmp_path)
    cache = payoff_cache(spec.id, tmp_path)
    assert cache.computed == 6  # 3 policies: 6 ordered pairs, one policy_value each
    meta_game(spec, first, tmp_path)
    assert cache.computed == 6
    # One new member: only its row and column (2 x 3 ordered pairs).
    meta_game(spec, first + [players["pass"]], tmp_path)
    assert cache.computed == 12
    stored = json.loads((tmp_path / CACHE_FILE).read_text())
    assert stored["game"] == KUHN and len(stored["entries"]) == 12
    # A new process (no memory cache) reads the file: nothing recomputed, identical numbers.
    clear_payoff_caches()
    again = meta_game(spec, first, tmp_path)
    assert payoff_cache(spec.id, tmp_path).computed == 0
    np.testing.assert_array_equal(again.payoff, game.payoff)
    np.testing.assert_array_equal(again.nash, game.nash)
    # A damaged file costs only time.
    clear_payoff_caches()
    (tmp_path / CACHE_FILE).write_text("{not json")
    np.testing.assert_array_equal(meta_game(spec, first, tmp_path).payoff, game.payoff)
    assert payoff_cache(spec.id, tmp_path).computed == 6


def test_relative_snapshot_paths_resolve_against_the_run_dir(players, tmp_path):
    spec = game_spec(KUHN)
    bet = players["bet"]
    relative = Member(bet.player_id, "snapshot", "test", snapshot_path="bet", snapshot_id=bet.snapshot_id)
    weights = meta_strategy(spec, [players["random"], relative], tmp_path)
    np.testing.assert_allclose(weights, [0, 1], atol=1e-9)


def test_output_policy_realises_the_meta_nash(players, tmp_path):
    spec = game_spec(KUHN)
    # A population holding only uniform policies outputs the uniform policy.
    table = league_output_policy(spec, [players["random"], players["uniform"]], tmp_path)
    assert exploitability(KUHN, table) == pytest.approx(UNIFORM_EXPLOITABILITY, abs=1e-6)
    assert exploitability(KUHN, table) == pytest.approx(exploitability(KUHN, RandomPolicy()), abs=1e-6)
    # With the dominant always-bet net present, the output is that net.
    table = league_output_policy(spec, [players["random"], players["bet"]], tmp_path)
    assert exploitability(KUHN, table) == pytest.approx(exploitability(KUHN, players["bet"].snapshot_path), abs=1e-6)


def test_refuses_games_and_members_it_cannot_score(players, tmp_path):
    with pytest.raises(PSROError, match="spiel:kuhn_poker"):
        meta_game(game_spec("tic_tac_toe"), [players["random"]], tmp_path)
    with pytest.raises(PSROError, match="not a frozen member"):
        meta_game(game_spec(KUHN), [Member("main", "learner", "main")], tmp_path)


SMALL = ["iterations=2", "matches_per_iteration=48", "num_envs=16", "snapshot_every_steps=40",
         "log.progress=false", "log.wandb=disabled", "log.tensorboard=false", "ppo.num_minibatches=2",
         "ppo.update_epochs=1"]


def _ledger(run_dir: Path) -> list[tuple]:
    with Store.open(run_dir, mode="read") as store:
        return [(m.result.match_id, m.result.kind, m.result.seed,
                 tuple((s.player_id, s.episode_return) for s in m.result.seats)) for m in store.iter_matches()]


def test_kuhn_poker_preset_league_runs_and_resumes_exactly(tmp_path):
    config = load_config("kuhn_poker", SMALL)
    assert config.roles[0].meta_nash > 0 and config.roles[0].self_play == 0
    league = League.create(config, tmp_path / "full")
    try:
        league.run()
        frozen = [m.player_id for m in league.population.frozen()]
    finally:
        league.close()
    assert frozen[0] == "anchor:random" and "main@2" in frozen  # a snapshot (PSRO iteration) per iteration
    full = _ledger(tmp_path / "full")
    training = [m for m in full if m[1] == "training"]
    assert training
    for _, _, _, seats in training:  # pure PSRO: the learner only ever meets frozen members
        opponents = [p for p, _ in seats if p != "main"]
        assert len(opponents) == 1 and opponents[0] in frozen
    assert (tmp_path / "full" / CACHE_FILE).is_file()
    value = output_exploitability(tmp_path / "full")
    assert 0.0 <= value <= 1.5

    # Stop after one iteration, lose the cache (memory and file), resume: the same games.
    league = League.create(config, tmp_path / "split")
    try:
        league.run(until_iteration=1)
    finally:
        league.close()
    clear_payoff_caches()
    (tmp_path / "split" / CACHE_FILE).unlink()
    league = League.resume(tmp_path / "split")
    try:
        league.run()
    finally:
        league.close()
    assert _ledger(tmp_path / "split") == full


def test_prd_league_writes_and_scores_its_prd_output_policy(tmp_path):
    """A PSRO role with the PRD meta-solver: the output checkpoint is the PRD mixture, and `ludus
    evaluate` scores it exactly as the league's metric."""
    import dataclasses

    from ludus.evaluation.league_hooks import league_hooks
    from ludus.agents.mixture import read_mixture

    kuhn = load_config("kuhn_poker", SMALL)
    config = dataclasses.replace(kuhn, roles=(dataclasses.replace(kuhn.roles[0], meta_solver="prd"),))
    league = League.create(config, tmp_path / "run")
    league.on_population_change.extend(league_hooks(config))
    try:
        league.run()
        frozen = league.population.frozen()
    finally:
        league.close()
    mixture = read_mixture(tmp_path / "run" / "output_policy")
    assert "PRD" in mixture.source and len(mixture.components) == len(frozen)  # PRD weighs every member
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [m["eval/exploitability"] for m in metrics if "eval/exploitability" in m][-1]
    clear_payoff_caches()
    assert output_exploitability(tmp_path / "run") == logged


def test_leduc_poker_preset_is_single_deep_cfr_with_an_average_output(tmp_path):
    """The Leduc preset: Single Deep CFR, no PSRO role; its output checkpoint is the average of all
    main snapshots (the CFR iterates)."""
    from ludus.agents.mixture import read_mixture

    config = load_config("leduc_poker", ["iterations=2", "matches_per_iteration=16", "num_envs=16", "cfr.traversals=20",
                                         "cfr.train_steps=5", "cfr.iterations_per_update=2", "log.progress=false",
                                         "log.wandb=disabled", "log.tensorboard=false"])
    assert config.learner == "sdcfr" and config.psro_role is None and config.output_policy == "uniform_average"
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
        snapshots = league.population.snapshots("main")
    finally:
        league.close()
    mixture = read_mixture(tmp_path / "run" / "output_policy")
    assert mixture.source.startswith("uniform average") and len(mixture.components) == len(snapshots) >= 2
    assert {c.weight for c in mixture.components} == {1.0 / len(snapshots)}
    assert 0.0 < output_exploitability(tmp_path / "run") < 4.0


def test_average_output_policy_is_the_linear_average_of_the_main_snapshots(tmp_path, monkeypatch):
    """`output_policy: average`: the output checkpoint holds every snapshot of the main role, the
    k-th weighted k (linear averaging); the league measures it at every
    AVERAGE_EVERY_SNAPSHOTS-th snapshot, and its metric, `ludus evaluate`'s reading of the run and
    the mixture aggregated by hand agree exactly."""
    import dataclasses

    from ludus.agents.solvers.exploitability import aggregate_mixture
    from ludus.agents.mixture import read_mixture
    from ludus.evaluation import league_hooks as hooks
    from ludus.league.config import ConfigError, RoleConfig
    from ludus.league.records.population import with_absolute_paths
    from ludus.league.psro import member_table

    psro = load_config("kuhn_poker", SMALL)
    with pytest.raises(ConfigError, match="output_policy"):
        dataclasses.replace(psro, output_policy="average")
    config = dataclasses.replace(psro, output_policy="average", iterations=3,
                                 roles=(RoleConfig(name="main", self_play=1.0, pfsp=0.0, uniform=0.0),))
    monkeypatch.setattr(hooks, "AVERAGE_EVERY_SNAPSHOTS", 2)
    league = League.create(config, tmp_path / "run")
    league.on_population_change.extend(hooks.league_hooks(config))
    try:
        league.run()
        snapshots = league.population.snapshots("main")
    finally:
        league.close()
    assert len(snapshots) >= 3
    mixture = read_mixture(tmp_path / "run" / "output_policy")
    assert "average" in mixture.source
    assert [c.player_id for c in mixture.components] == [m.player_id for m in snapshots]
    n = len(snapshots)
    assert [c.weight for c in mixture.components] == pytest.approx([2 * k / (n * (n + 1)) for k in range(1, n + 1)])

    clear_payoff_caches()
    tables = [member_table(game_spec(KUHN), m, payoff_cache(KUHN, None))
              for m in with_absolute_paths(snapshots, tmp_path / "run")]

    def average_of_first(n: int) -> float:
        return exploitability(KUHN, aggregate_mixture(KUHN, tables[:n], list(range(1, n + 1))))

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [m["eval/exploitability"] for m in metrics if "eval/exploitability" in m]
    assert len(logged) == len(snapshots) // 2  # at 2, 4, ... snapshots
    assert logged[-1] == pytest.approx(average_of_first(2 * len(logged)), abs=1e-12)
    assert output_exploitability(tmp_path / "run") == pytest.approx(average_of_first(len(snapshots)), abs=1e-12)


@pytest.mark.slow
def test_short_psro_league_becomes_hard_to_exploit(tmp_path):
    """~10 PSRO iterations of the preset take the output policy far below uniform's 0.4583."""
    config = load_config("kuhn_poker", ["iterations=260", "log.progress=false", "log.wandb=disabled",
                                        "log.tensorboard=false"])
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
    finally:
        league.close()
    value = output_exploitability(tmp_path / "run")
    assert value < 0.15, value
