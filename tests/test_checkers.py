"""The seams' conformance checkers, run over every implementation Ludus ships.

`check_game` runs over every game in tests/test_check_game.py; here `check_policy` runs over every
bot and every kind of net policy, `check_learner` over every league learner (every row of the table of
learner kinds, and the DeepSpeed update backend), and `check_backend` over the process backend (Ray: tests/test_ray_backend.py).
Each checker is also shown to catch a planted fault, so none of them passes vacuously.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ludus.agents.bots.builtin import make_bot
from ludus.agents.check import PolicyCheckError, check_policy
from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import ActOutput
from ludus.agents.torch_policy import TorchPolicy
from ludus.games.registry import spec as game_spec
from ludus.league.check import BackendCheckError, LearnerCheckError, check_backend, check_learner
from ludus.league.config import load_config
from ludus.league.learners.kinds import learner_kind, learner_kinds

QUIET = ["log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]
TINY_PPO = ["game=tic_tac_toe", "num_envs=8", "net.hidden=[16]", "ppo.num_minibatches=2", "ppo.update_epochs=2", *QUIET]
TINY_NEGOTIATION = ["num_envs=8", "dialogue.imitation_steps=10", "dialogue.lm.n_layer=1", "dialogue.lm.n_embd=16",
                    "dialogue.lm.n_head=2", "dialogue.token_ppo.minibatch_size=8", *QUIET]
TINY_SDCFR = ["game=spiel:kuhn_poker", "num_envs=8", "net.hidden=[16]", "cfr.traversals=20", "cfr.train_steps=5",
              "cfr.iterations_per_update=2", "cfr.batch_size=32", *QUIET]

BOTS = [("random", "tic_tac_toe"), ("random", "connect_four"), ("random", "spiel:kuhn_poker"),
        ("mcts-10", "tic_tac_toe"), ("perfect", "tic_tac_toe"), ("random", "negotiation"),
        ("negotiator-fair", "negotiation"), ("negotiator-tough", "negotiation"), ("negotiator-soft", "negotiation"),
        ("random-split", "negotiation")]


@pytest.mark.parametrize("bot,game_id", BOTS)
def test_every_bot_keeps_the_policy_protocol(bot, game_id):
    report = check_policy(make_bot(bot, game_spec(game_id)), game_id, num_games=2)
    assert report.act_calls > 0


@pytest.mark.parametrize("game_id", ["tic_tac_toe", "spiel:kuhn_poker", "simple_tag"])
def test_net_policies_keep_the_policy_protocol(game_id):
    torch.manual_seed(0)
    check_policy(TorchPolicy(ActorCritic(game_spec(game_id), NetConfig(hidden=(16,)))), game_id, num_games=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_frozen_net_policies_keep_the_policy_protocol(dtype):
    """Frozen nets act together as a stack (ludus.agents.nets.StackedActors: bf16 nets always,
    float32 nets where the float32 grouped kernel runs); the checker holds act_together to acting
    in turn."""
    torch.manual_seed(0)
    net = ActorCritic(game_spec("connect_four"), NetConfig(hidden=(16,), activation="relu"))
    check_policy(TorchPolicy(net, compute_values=False, dtype=dtype), "connect_four", num_games=2)


def test_check_policy_catches_acting_together_that_is_not_acting_in_turn(monkeypatch):
    together = TorchPolicy.act_together

    def reversed_rows(requests, rng):  # draws as it should, answers each request with the next one's actions
        outputs = together(requests, rng)
        return outputs[1:] + outputs[:1]

    monkeypatch.setattr(TorchPolicy, "act_together", staticmethod(reversed_rows))
    torch.manual_seed(0)
    policy = TorchPolicy(ActorCritic(game_spec("connect_four"), NetConfig(hidden=(16,))))
    with torch.no_grad():
        policy.net.policy_head.weight.mul_(100.0)  # sampled and greedy actions then differ at some step
    with pytest.raises(PolicyCheckError, match="act_together gave"):
        check_policy(policy, "connect_four", num_games=2)


@pytest.mark.parametrize("preset", ["simple_tag", "simple_spread", "tic_tac_toe_2v2"])
def test_mappo_sides_keep_the_policy_protocol(preset):
    """A MAPPO side at play (the actor chooses, the centralised critic values each row from the input
    the runners record: the global state, or the side's observations where the game has none)."""
    from ludus.league.learners.mappo import MAPPOArchitecture, mappo_config

    torch.manual_seed(0)
    config = load_config(preset, [])
    _, policy = MAPPOArchitecture(config.net, mappo_config(config)).build(game_spec(config.game))
    assert policy.needs_critic_input
    check_policy(policy, config.game, num_games=2)


def test_bfloat16_runners_act_with_mappo_actors_in_bfloat16():
    """inference_dtype reaches a MAPPO side's actor (its critic's values stay float32)."""
    from ludus.league.play.backends import PolicyProvider
    from ludus.league.learners.mappo import MAPPOArchitecture, mappo_config
    from ludus.league.play.runner import LearnerWeights

    config = load_config("simple_tag", [])
    spec = game_spec(config.game)
    architecture = MAPPOArchitecture(config.net, mappo_config(config))
    module, _ = architecture.build(spec)
    provider = PolicyProvider(spec, architecture, cache_size=1, inference_dtype="bfloat16")
    provider.set_learner(LearnerWeights("predators", 1, {k: v.numpy() for k, v in module.state_dict().items()}))
    policy = provider.policy_of("predators")
    assert policy.dtype == torch.bfloat16
    check_policy(policy, config.game, num_games=1)


def test_the_lm_policy_keeps_the_policy_protocol():
    from ludus.league.learners.dialogue import lm_architecture

    config = load_config("negotiation", TINY_NEGOTIATION)
    _, policy = lm_architecture(game_spec("negotiation"), config.dialogue.lm).build(game_spec("negotiation"))
    check_policy(policy, "negotiation", num_games=1)


def test_check_policy_catches_an_illegal_move_and_a_policy_that_ignores_its_seed():
    class FirstAction:
        needs_history = False

        def act(self, batch, rng, greedy=False):
            n = len(batch)
            return ActOutput(np.zeros(n, np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32))

    with pytest.raises(PolicyCheckError, match="illegal action"):
        check_policy(FirstAction(), "tic_tac_toe", num_games=1)

    class Unseeded:
        needs_history = False

        def __init__(self):
            self.rng = np.random.default_rng()

        def act(self, batch, rng, greedy=False):
            legal = np.flatnonzero(batch.mask[0])
            # greedy play is deterministic, so only the unseeded sampling can fail (two samples
            # may agree by chance at one step; a later step then tells them apart)
            action = np.array([legal[0] if greedy else self.rng.choice(legal)], np.int64)
            return ActOutput(action, np.full(1, -np.log(len(legal)), np.float32), np.zeros(1, np.float32))

    with pytest.raises(PolicyCheckError, match="would not replay"):
        check_policy(Unseeded(), "connect_four", num_games=1)


def _lm_overrides(base) -> list[str]:
    return [f"text_lm.model.base={base}", "iterations=2", "matches_per_iteration=12", "num_envs=12", *QUIET]


TINY_KINDS = {
    "ppo": lambda bases: load_config("quickstart", TINY_PPO),
    "mappo": lambda bases: load_config("simple_spread", [*QUIET, "num_envs=4", "learner=mappo"]),
    "ippo": lambda bases: load_config("simple_spread", [*QUIET, "num_envs=4", "learner=ippo"]),
    "token_ppo": lambda bases: load_config("negotiation", TINY_NEGOTIATION),
    "text_ppo": lambda bases: load_config("llm_kuhn_poker", [*_lm_overrides(bases[0]), "learner=text_ppo",
                                                             "text_lm.ppo.minibatch_size=64",
                                                             "text_lm.ppo.micro_batch_size=32"]),
    "text_mmd": lambda bases: load_config("llm_kuhn_poker", [*_lm_overrides(bases[0]), "text_lm.mmd.distill_steps=2"]),
    "text_exit": lambda bases: load_config("llm_tic_tac_toe", [*_lm_overrides(bases[0]), "text_lm.exit.steps=2",
                                                               "text_lm.exit.simulations=50",
                                                               "num_envs=4"]),
    "text_smmd": lambda bases: load_config("llm_any_game", [*_lm_overrides(bases[0]), "text_lm.smmd.distill_steps=2",
                                                            "text_lm.smmd.critic_steps=3"]),
    "sdcfr": lambda bases: load_config("leduc_poker", TINY_SDCFR),
}
"""A tiny config of every learner kind Ludus ships (the LM kinds on the tests' tiny random Llama)."""


SHIPPED_KINDS = [kind.name for kind in learner_kinds()]
"""The table's rows at collection (a test that adds a toy kind restores the table after it)."""


def test_every_shipped_learner_kind_has_a_tiny_config():
    assert sorted(SHIPPED_KINDS) == sorted(TINY_KINDS)


@pytest.mark.parametrize("name", SHIPPED_KINDS)
def test_every_learner_kind_resumes_exactly_from_its_state_dict(name, request):
    """`check_learner` over every row of the table of learner kinds (league/learners/kinds.py)."""
    bases = request.getfixturevalue("tiny_bases") if learner_kind(name).text_lm else None
    config = TINY_KINDS[name](bases)
    assert config.learner == name
    report = check_learner(config)
    assert report.learner == name and report.tensors > 0


def test_the_deepspeed_ppo_learner_resumes_exactly_from_its_state_dict():
    report = check_learner(load_config("quickstart", [*TINY_PPO, "learner_backend.backend=deepspeed",
                                                      "ppo.minibatch_size=16"]))
    assert report.tensors > 0 and report.rows > 0


def test_check_learner_catches_state_that_is_not_saved(monkeypatch):
    from ludus.league.learners.base import PPOLeagueLearner

    state_dict = PPOLeagueLearner.state_dict
    # a learner that forgets its optimizer state: the restored one steps from fresh Adam moments
    monkeypatch.setattr(PPOLeagueLearner, "state_dict",
                        lambda self: {k: v for k, v in state_dict(self).items() if not k.startswith("optimizer.state")})
    monkeypatch.setattr(PPOLeagueLearner, "load_state_dict",
                        lambda self, state: self.ppo.net.load_state_dict(
                            {k[4:]: v for k, v in state.items() if k.startswith("net.")}))
    with pytest.raises(LearnerCheckError):
        check_learner(load_config("quickstart", TINY_PPO))


SMALL_RUN = [*TINY_PPO, "iterations=3", "matches_per_iteration=16", "snapshot_every_steps=60", "num_runners=2",
             "anchors=[random]", "rating_share=0.2"]


def test_the_process_backend_writes_the_serial_backends_ledger_and_snapshots(tmp_path):
    report = check_backend(load_config("quickstart", SMALL_RUN), "process", workdir=str(tmp_path))
    assert report.matches > 0 and report.snapshots >= 2


def test_check_backend_catches_a_backend_that_plays_other_matches(tmp_path, monkeypatch):
    from ludus.league import manager  # the league picks its backend class there (make_backend)
    from ludus.league.play import backends

    class ShiftedSeeds(backends.ProcessBackend):
        def submit(self, tasks, weights):
            from dataclasses import replace

            return super().submit([replace(t, sample_seed=t.sample_seed + 1) for t in tasks], weights)

    monkeypatch.setattr(manager, "ProcessBackend", ShiftedSeeds)
    with pytest.raises(BackendCheckError):
        check_backend(load_config("quickstart", SMALL_RUN), "process", workdir=str(tmp_path))
