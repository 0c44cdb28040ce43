"""Single Deep CFR (agents/solvers/deep_cfr.py, league/learners/cfr.py): regret matching, the reservoir memory, the
sampled regrets, and the league learner 'sdcfr' converging on Kuhn poker."""

from __future__ import annotations

import numpy as np
import pyspiel
import pytest
import torch

from ludus.agents.solvers.deep_cfr import DeepCFRConfig, ExternalSampler, ReservoirMemory, SDCFRLearner
from ludus.agents.nets import ActorCritic, NetConfig, regret_matching_logits
from ludus.games.registry import spec as game_spec
from ludus.games.adapters.spiel import spiel_observation
from ludus.league.configio import ConfigError

QUIET = ["log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]


def _probs(advantages, mask) -> np.ndarray:
    logits = regret_matching_logits(torch.tensor([advantages]), torch.tensor([mask]))
    return torch.softmax(logits, -1)[0].numpy()


def test_regret_matching_plays_positive_regrets_in_proportion_and_the_best_action_without_any():
    np.testing.assert_allclose(_probs([1.0, 3.0, -2.0], [True, True, True]), [0.25, 0.75, 0.0], atol=1e-7)
    # an illegal action's regret counts for nothing
    np.testing.assert_allclose(_probs([1.0, 3.0, 5.0], [True, True, False]), [0.25, 0.75, 0.0], atol=1e-7)
    # no positive regret: the best legal action (Deep CFR), ties shared
    np.testing.assert_allclose(_probs([-1.0, -0.5, 9.0], [True, True, False]), [0.0, 1.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(_probs([-1.0, -1.0, -3.0], [True, True, True]), [0.5, 0.5, 0.0], atol=1e-7)


def test_the_regret_matching_head_is_the_policy_of_a_net_and_its_snapshot(tmp_path):
    from ludus.agents.solvers.exploitability import action_distribution
    from ludus.agents.snapshot import load_snapshot, policy_from_snapshot, save_snapshot

    spec = game_spec("spiel:kuhn_poker")
    torch.manual_seed(0)
    net = ActorCritic(spec, NetConfig(hidden=(8,), head="regret_matching"))
    with torch.no_grad():
        net.policy_head.weight.normal_(0, 1.0)  # regrets of both signs
    save_snapshot(net, spec, net.config, tmp_path / "s")
    assert load_snapshot(tmp_path / "s").net.config.head == "regret_matching"
    obs = torch.randn(64, *spec.observation_shape)
    mask = torch.ones(64, spec.num_actions, dtype=torch.bool)
    expected = torch.softmax(regret_matching_logits(net.head_outputs(obs), mask), -1).detach().numpy()
    played = action_distribution(policy_from_snapshot(tmp_path / "s"), obs.numpy(), mask.numpy(), np.zeros(64, np.int64))
    np.testing.assert_allclose(played, expected, atol=1e-6)


def test_the_reservoir_keeps_a_uniform_sample_of_everything_added():
    memory = ReservoirMemory(1000, obs_dim=1, num_actions=1)
    rng = np.random.default_rng(0)
    for start in range(0, 20_000, 700):  # chunks of any size, as traversals produce them
        labels = np.arange(start, min(start + 700, 20_000), dtype=np.float32)[:, None]
        memory.add(labels, np.zeros_like(labels), np.ones_like(labels, bool), 1.0, rng)
    kept = memory.obs[:, 0]
    assert len(memory) == 1000 and memory.seen == 20_000 and len(np.unique(kept)) == 1000
    # a uniform sample of 0..19999: mean 10000 (std of the mean ~183), each quarter ~250
    assert abs(kept.mean() - 10_000) < 800
    assert np.all(np.abs(np.histogram(kept, bins=4, range=(0, 20_000))[0] - 250) < 70)


def test_sampled_regrets_average_to_the_counterfactual_regrets_at_the_root_decision():
    """Kuhn poker, uniform play: player 0's first decision (card J, K or Q) has sampled regrets whose
    mean over traversals approaches the exact ones (chance and player 1 sampled, player 0 explored)."""
    from open_spiel.python import policy as sp_policy
    from open_spiel.python.algorithms import expected_game_score

    game = pyspiel.load_game("kuhn_poker")
    spec = game_spec("spiel:kuhn_poker")
    net = ActorCritic(spec, NetConfig(hidden=(8,), head="regret_matching"))
    with torch.no_grad():  # zero regrets everywhere: regret matching's uniform tie
        net.policy_head.weight.zero_()
        net.policy_head.bias.zero_()
    sampler = ExternalSampler(game, lambda state, seat: spiel_observation(state, seat, "information_state"), net,
                              np.random.default_rng(1))
    for _ in range(6000):
        sampler.traverse(game.new_initial_state(), 0)
    obs, regrets, _ = sampler.take_samples()
    # Kuhn's information-state tensor: player (2), card (3), then the betting; none yet here
    opening = (obs[:, 0] == 1) & (obs[:, 5:].sum(1) == 0)
    cards = obs[opening, 2:5].argmax(1)
    uniform = sp_policy.UniformRandomPolicy(game)
    for card in range(3):
        values = []  # v(I, a): the opponent's card and everything after drawn uniformly
        for action in (0, 1):
            total = 0.0
            for other in set(range(3)) - {card}:
                state = game.new_initial_state()
                for move in (card, other, action):
                    state.apply_action(move)
                total += 0.5 * expected_game_score.policy_value(state, [uniform, uniform])[0]
            values.append(total)
        exact = np.array(values) - np.mean(values)  # regrets against the uniform sigma
        np.testing.assert_allclose(regrets[opening][cards == card][:, :2].mean(0), exact, atol=0.1)


def test_an_sdcfr_league_approaches_the_kuhn_equilibrium(tmp_path):
    from ludus.evaluation.league_hooks import exploitability_metrics
    from ludus.league.api import League, load_config

    config = load_config("leduc_poker", ["game=spiel:kuhn_poker", "iterations=30", "matches_per_iteration=16",
                                         "num_envs=16", "net.hidden=[32, 32]", "cfr.traversals=50",
                                         "cfr.train_steps=20", "cfr.iterations_per_update=2", *QUIET])
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
        metrics = exploitability_metrics(league.spec, league.config, league.population.frozen(), league.run_dir)
    finally:
        league.close()
    assert len(league.population.snapshots("main")) == 31  # the founder and one iterate per update
    # uniform random play is 0.458 exploitable; 60 CFR iterations' average is near the equilibrium
    assert metrics["eval/exploitability"] < 0.1


@pytest.mark.parametrize("overrides,message", [
    (["learner=ppo"], "go together"),
    (["net.head=softmax"], "go together"),
    (["game=tic_tac_toe"], "not a spiel: game"),
    (["ppo.learning_rate=0.1"], "does not use ppo.learning_rate"),
])
def test_sdcfr_configs_that_cannot_work_are_refused(overrides, message):
    from ludus.league.api import load_config

    with pytest.raises(ConfigError, match=message):
        load_config("leduc_poker", overrides)


def test_sdcfr_config_values_are_checked():
    with pytest.raises(ValueError, match="cfr.traversals"):
        DeepCFRConfig(traversals=0)
    with pytest.raises(ValueError, match="regret_matching"):
        SDCFRLearner(pyspiel.load_game("kuhn_poker"), None, ActorCritic(game_spec("spiel:kuhn_poker")),
                     DeepCFRConfig(), seed=0)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_regret_matching_net_exports_and_reproduces_its_policy(tmp_path, fmt):
    from ludus.agents.export import export_net

    torch.manual_seed(0)
    net = ActorCritic(game_spec("spiel:leduc_poker"), NetConfig(hidden=(16,), head="regret_matching"))
    with torch.no_grad():
        net.policy_head.weight.normal_(0, 1.0)
    export_net(net, fmt, tmp_path / f"net.{fmt}")  # raises unless the exported file gives the net's logits


def test_an_sdcfr_run_resumed_midway_equals_one_trained_through(tmp_path):
    """The memory, the known information states and the generator travel in the checkpoint:
    2 iterations, a resume, 2 more give the snapshots of 4 in one go, bit for bit."""
    from ludus.league.api import League, load_config

    config = load_config("leduc_poker", ["iterations=4", "matches_per_iteration=8", "num_envs=8", "net.hidden=[16]",
                                         "cfr.traversals=20", "cfr.train_steps=5", "cfr.iterations_per_update=2",
                                         *QUIET])

    def snapshot_ids(league) -> list[str]:
        return [m.snapshot_id for m in league.population.snapshots("main")]

    straight = League.create(config, tmp_path / "straight")
    try:
        straight.run()
        expected = snapshot_ids(straight)
    finally:
        straight.close()
    first = League.create(config, tmp_path / "resumed")
    try:
        first.run(until_iteration=2)
    finally:
        first.close()
    second = League.resume(tmp_path / "resumed")
    try:
        second.run()
        assert snapshot_ids(second) == expected and len(expected) == 5
    finally:
        second.close()
