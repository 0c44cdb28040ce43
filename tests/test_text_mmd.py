"""Magnetic mirror descent on a game's exact tree (agents/solvers/mmd.py) and for an LM's answer table
(agents/lm/text_mmd.py, learner 'text_mmd'): tabular convergence pinned on Kuhn poker, the tree's
action values against OpenSpiel's game value, and the LM learner in a league on a tiny Llama."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from open_spiel.python.algorithms import expected_game_score

from ludus.agents.solvers.mmd import action_values, as_table_policy, information_states, mmd_target, table_exploitability, tabular_mmd
from ludus.games.adapters.spiel import spiel_game_for, spiel_observation, spiel_observation_kind
from ludus.league.configio import ConfigError

KUHN = "spiel:kuhn_poker"


@pytest.fixture(scope="module")
def kuhn():
    kind = spiel_observation_kind(KUHN)
    game = spiel_game_for(KUHN)
    return game, information_states(game, lambda state, seat: spiel_observation(state, seat, kind))


def test_information_states_are_openspiels_table_rows(kuhn):
    game, states = kuhn
    assert len(states) == 12 and states.masks.sum() == 24
    table = as_table_policy(game, states.masks / 2.0)
    assert [table.state_lookup[key] for key in states.keys] == list(range(12))
    assert set(states.players.tolist()) == {0, 1}


def test_action_values_give_the_game_value(kuhn):
    """Player 0's first information states ('0', '1', '2') are each reached with probability 1/3,
    so sum over them of 1/3 * sum_a pi(a) Q(a) is the game's value under pi."""
    game, states = kuhn
    policy = np.random.default_rng(0).dirichlet([1.0, 1.0], size=len(states))
    values = action_values(game, policy)
    first = [states.keys.index(k) for k in ("0", "1", "2")]
    value = sum((policy[s] * values[s]).sum() / 3.0 for s in first)
    expected = expected_game_score.policy_value(game.new_initial_state(), [as_table_policy(game, policy)] * 2)
    assert value == pytest.approx(expected[0], abs=1e-12)


def test_mmd_target_is_the_closed_form():
    policy, magnet = np.array([[0.5, 0.5]]), np.array([[0.25, 0.75]])
    values, mask = np.array([[1.0, 0.0]]), np.ones((1, 2), bool)
    target = mmd_target(policy, values, magnet, mask, alpha=0.5, eta=2.0)
    unnormalised = (policy * magnet ** 1.0 * np.exp(2.0 * values)) ** 0.5
    np.testing.assert_allclose(target, unnormalised / unnormalised.sum())
    # with no pull to the magnet and no step, the policy stays
    np.testing.assert_allclose(mmd_target(policy, values, magnet, mask, 0.0, 1e-12), policy)


def test_tabular_mmd_last_iterate_converges_on_kuhn_poker(kuhn):
    """Sokota et al. 2023: MMD's last iterate converges to the magnet-regularised QRE. On Kuhn poker
    with a uniform magnet, alpha 0.2, eta 0.3: exploitability 0.0436 (measured; uniform play 0.4583;
    0.0432 at iteration 100), where the unregularised update (alpha 0: multiplicative weights in
    self-play) keeps cycling far from it (0.15-0.22 over iterations 50-200)."""
    game, states = kuhn
    uniform = states.masks / states.masks.sum(axis=1, keepdims=True)
    at_200 = tabular_mmd(game, states.masks, uniform, alpha=0.2, eta=0.3, iterations=200)
    at_300 = tabular_mmd(game, states.masks, uniform, alpha=0.2, eta=0.3, iterations=300)
    assert table_exploitability(game, at_200) == pytest.approx(0.0436, abs=0.001)
    assert np.abs(at_300 - at_200).max() < 1e-4  # a fixed point, not a cycle
    unregularised = tabular_mmd(game, states.masks, uniform, alpha=0.0, eta=0.3, iterations=200)
    assert table_exploitability(game, unregularised) > 0.1


# ------------------------------------------------------------------------------ the LM learner


def _mmd_config(base: Path, *extra: str):
    from ludus.league.api import load_config

    return load_config("llm_kuhn_poker", [f"text_lm.model.base={base}", "iterations=2", "matches_per_iteration=12",
                                          "num_envs=12", "log.wandb=disabled", "log.tensorboard=false",
                                          "log.progress=false", "text_lm.mmd.distill_steps=2", *extra])


@pytest.mark.parametrize("activation_tokens", [0, 4])
def test_mmd_moves_the_lm_table_towards_its_target(tiny_bases, activation_tokens):
    """Also with activated adapters (the table read from "assistant\n[" on)."""
    from ludus.agents.lm.pretrained import LoRAConfig, PretrainedLMConfig
    from ludus.games.registry import spec as game_spec
    from ludus.league.learners.text_lm import TextMMDLeagueLearner

    config = _mmd_config(tiny_bases[0], "text_lm.mmd.distill_steps=6", "text_lm.mmd.learning_rate=3e-3",
                         "text_lm.mmd.eta=3.0", f"text_lm.model.lora.activation_tokens={activation_tokens}")
    assert config.text_lm.model == PretrainedLMConfig(base=str(tiny_bases[0]),
                                                      lora=LoRAConfig(activation_tokens=activation_tokens))
    learner = TextMMDLeagueLearner(game_spec(KUHN), config, 0, seed=0, init_seed=1)
    before = learner.mmd.table()
    target = mmd_target(before, action_values(learner.game, before), learner.mmd.magnet, learner.states.masks,
                        0.2, 3.0)
    stats = learner.update(None, progress=0.0)
    after = learner.mmd.table()
    # the table moved towards the target, most states the way their own target asks
    assert (np.abs(after - target).sum() < np.abs(before - target).sum())
    moved = np.sign(after[:, 1] - before[:, 1])
    wanted = np.sign(target[:, 1] - before[:, 1])
    assert (moved == wanted).mean() >= 0.75
    assert stats["table_exploitability"] == pytest.approx(table_exploitability(learner.game, after), abs=1e-9)
    assert learner.updates == 1


def test_mmd_league_rates_its_snapshots_and_resumes_exactly(tiny_bases, tmp_path):
    from ludus.league.api import League
    from ludus.league.check import resumed_fingerprint, run_fingerprint

    config = _mmd_config(tiny_bases[0], "snapshot_every_steps=10")
    whole = League.create(config, tmp_path / "whole")
    whole.run()
    members = {m.player_id for m in whole.population.members()}
    assert {"anchor:base", "anchor:random", "main@0"} <= members and len(members) > 3
    whole.close()
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    learned = [m["losses/main/table_exploitability"] for m in metrics if "losses/main/table_exploitability" in m]
    assert len(learned) == 2 and all(0.0 <= x <= 2.0 for x in learned)
    rows, snapshots = run_fingerprint(tmp_path / "whole")
    assert len(snapshots) > 1 and (rows, snapshots) == resumed_fingerprint(config, tmp_path / "half")


def test_mmd_config_errors_are_one_line(tiny_bases):
    from ludus.league.api import load_config

    with pytest.raises(ConfigError, match="is not a spiel: game"):
        load_config("llm_kuhn_poker", ["game=tic_tac_toe"])
    with pytest.raises(ConfigError, match="response_prefix"):
        load_config("llm_kuhn_poker", ["text_lm.play.prompt.response_prefix="])
    with pytest.raises(ConfigError, match="does not use text_lm.ppo"):
        load_config("llm_kuhn_poker", ["text_lm.ppo.kl_coef=0.1"])
    with pytest.raises(ConfigError, match="does not use text_lm.mmd"):
        load_config("llm_kuhn_poker", ["learner=text_ppo", "text_lm.mmd.eta=0.5"])
    with pytest.raises(ConfigError, match="deepspeed"):
        load_config("llm_kuhn_poker", ["learner_backend.backend=deepspeed"])
    with pytest.raises(ConfigError, match="distill_steps"):
        load_config("llm_kuhn_poker", ["text_lm.mmd.distill_steps=0"])


def test_an_lm_learner_resets_to_its_snapshot_and_refuses_other_adapters(tiny_bases, tmp_path):
    """`reset_to` (a role's periodic reset) puts a snapshot's adapters back exactly; a snapshot of
    other adapters (here `lora.layers`) is refused in one line, not loaded in part."""
    import torch

    from ludus.agents.lm.model import LMError
    from ludus.agents.lm.pretrained import trained_state
    from ludus.agents.snapshot import Lineage
    from ludus.games.registry import spec as game_spec
    from ludus.league.learners.text_lm import TextMMDLeagueLearner

    learner = TextMMDLeagueLearner(game_spec(KUHN), _mmd_config(tiny_bases[0]), 0, seed=0, init_seed=1)
    saved = learner.freeze(tmp_path / "main@0", Lineage(role="main", created_by="test"))
    frozen = trained_state(learner.lm.model)
    learner.update(None, progress=0.0)
    assert any(not torch.equal(frozen[k], v) for k, v in trained_state(learner.lm.model).items())
    learner.reset_to(Path(saved.path), seed=5)
    assert all(torch.equal(frozen[k], v) for k, v in trained_state(learner.lm.model).items())
    assert learner.updates == 1  # versions keep counting

    top = TextMMDLeagueLearner(game_spec(KUHN), _mmd_config(tiny_bases[0], "text_lm.model.lora.layers=1"), 0,
                               seed=0, init_seed=1)
    other = top.freeze(tmp_path / "top@0", Lineage(role="main", created_by="test"))
    with pytest.raises(LMError, match="has adapters") as info:
        learner.reset_to(Path(other.path), seed=5)
    assert "\n" not in str(info.value)
