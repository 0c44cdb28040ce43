"""The DeepSpeed learner backend: config checks, ZeRO 0/1/2 steps, torch-equal trajectories, checkpoints.

The tests run one rank whose rendezvous is a free port on loopback (see `one_rank_on_loopback`).
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch

from ludus.agents.deepspeed_backend import (
    DeepSpeedBackend,
    LearnerBackendConfig,
    LearnerBackendError,
    deepspeed_config,
    make_token_update_backend,
    make_update_backend,
    micro_batch_size,
)
from ludus.agents.data_parallel import synthetic_batch
from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.rl.ppo import PPOConfig, PPOLearner
from ludus.agents.ppo_core import TorchAdam
from ludus.agents.rollout import RolloutBatch
from ludus.agents.threads import torch_threads
from ludus.games.registry import spec as game_spec
from ludus.errors import UserError

SPEC = game_spec("tic_tac_toe")
NET = NetConfig(hidden=(32,))
PPO = PPOConfig(minibatch_size=16, update_epochs=2)


@pytest.fixture(autouse=True, scope="module")
def one_rank_on_loopback():
    """One rank, rendezvous on a free loopback port. DeepSpeed caches its process groups for the
    life of the process (a destroyed and re-created group is not picked up), so the group made by
    the first engine serves every test of the module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # tiny nets: a second torch thread only spins
    with torch_threads(1), pytest.MonkeyPatch.context() as patch:
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0",
                           "WORLD_SIZE": "1", "GLOO_SOCKET_IFNAME": "lo"}.items():
            patch.setenv(key, value)
        yield


def deepspeed(stage: int = 0, **settings) -> LearnerBackendConfig:
    return LearnerBackendConfig(backend="deepspeed", zero_stage=stage, **settings)


def rollout(seed: int, n: int = 64) -> RolloutBatch:
    """A synthetic PPO batch on tic-tac-toe observations (every parameter gets a gradient)."""
    return synthetic_batch(seed, n)


def learner(backend_config: LearnerBackendConfig, ppo: PPOConfig = PPO) -> PPOLearner:
    torch.manual_seed(0)
    net = ActorCritic(SPEC, NET)
    return PPOLearner(net, ppo, seed=1, backend=make_update_backend(net, ppo, backend_config))


def trajectory(ppo_learner: PPOLearner, seeds) -> np.ndarray:
    rows = []
    for seed in seeds:
        s = ppo_learner.update(rollout(seed))
        rows.append([s.policy_loss, s.value_loss, s.entropy, s.approx_kl, s.grad_norm])
    return np.array(rows)


# ------------------------------------------------------------------------------ validation


def test_fp16_on_cpu_is_refused_with_one_line_before_deepspeed(monkeypatch):
    # a machine without a GPU, whatever this one has; on a GPU the same setting is accepted
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as error:
        deepspeed(1, fp16=True)
    message = str(error.value)
    assert "fp16" in message and "GPU" in message and "bf16" in message and "\n" not in message
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert deepspeed(1, fp16=True).fp16


def test_impossible_settings_are_refused():
    with pytest.raises(LearnerBackendError, match="train_micro_batch_size=8 differs"):
        micro_batch_size(deepspeed(train_micro_batch_size=8), 16)
    with pytest.raises(LearnerBackendError, match="ppo.minibatch_size"):
        make_update_backend(ActorCritic(SPEC, NET), PPOConfig(), deepspeed())  # num_minibatches only
    with pytest.raises(LearnerBackendError, match="zero_stage=3"):
        deepspeed(3)
    with pytest.raises(LearnerBackendError, match="bf16 needs zero_stage"):
        deepspeed(0, bf16=True)
    with pytest.raises(LearnerBackendError, match="offload_optimizer needs"):
        deepspeed(0, offload_optimizer=True)
    with pytest.raises(LearnerBackendError, match="backend=deepspeed"):
        LearnerBackendConfig(zero_stage=2)
    assert micro_batch_size(deepspeed(), 16) == 16


@pytest.mark.parametrize("settings", [deepspeed(0), deepspeed(2, offload_optimizer=True), deepspeed(1, bf16=True)])
def test_deepspeed_accepts_our_config(settings):
    from deepspeed.runtime.config import DeepSpeedConfig

    checked = DeepSpeedConfig(deepspeed_config(settings, 16, 0.5))
    assert checked.zero_optimization_stage == settings.zero_stage
    assert checked.bfloat16_config.enabled == settings.bf16
    assert (checked.zero_config.offload_optimizer is not None) == settings.offload_optimizer
    assert checked.gradient_clipping == (0.5 if settings.zero_stage else 0.0)
    assert checked.train_micro_batch_size_per_gpu == 16 and checked.gradient_accumulation_steps == 1


# ------------------------------------------------------------------------------ training


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_stage_steps_like_torch_adam(stage):
    torch_run = trajectory(learner(LearnerBackendConfig()), range(3))
    ds_learner = learner(deepspeed(stage))
    assert isinstance(ds_learner.backend, DeepSpeedBackend)
    assert type(ds_learner.backend.optimizer).__name__ == ("Adam" if stage == 0 else "DeepSpeedZeroOptimizer")
    ds_run = trajectory(ds_learner, range(3))
    # Same client Adam, same clipping: the same steps up to float32 summation order.
    np.testing.assert_allclose(ds_run, torch_run, rtol=1e-5, atol=1e-6)
    assert not np.allclose(torch_run[0], torch_run[-1])  # the weights moved


@pytest.mark.parametrize("settings", [deepspeed(1, bf16=True), deepspeed(2, offload_optimizer=True)])
def test_bf16_and_offload_train(settings):
    ds_learner = learner(settings)
    before = {k: v.float().clone() for k, v in ds_learner.net.state_dict().items()}
    ds_learner.set_learning_rate(1e-3)
    stats = ds_learner.update(rollout(0))
    assert ds_learner.backend.learning_rate() == pytest.approx(1e-3)
    assert np.isfinite([stats.policy_loss, stats.value_loss, stats.grad_norm]).all() and stats.grad_norm > 0
    after = ds_learner.net.state_dict()
    assert all(after[k].dtype == (torch.bfloat16 if settings.bf16 else torch.float32) for k in after)
    assert any(not torch.equal(before[k], after[k].float()) for k in before)
    master = ds_learner.backend.state_dict()["master.0"]
    assert master.dtype == torch.float32


# ------------------------------------------------------------------------------ checkpoints


def _continue_identically(original: PPOLearner, restored: PPOLearner) -> None:
    np.testing.assert_array_equal(trajectory(restored, [7, 8]), trajectory(original, [7, 8]))


@pytest.mark.parametrize("settings", [deepspeed(2), deepspeed(1, bf16=True)])
def test_state_dict_round_trip_through_safetensors(settings):
    from safetensors.torch import load, save

    original = learner(settings)
    trajectory(original, [0, 1])
    blob = save({k: v.contiguous() for k, v in original.state_dict().items()})
    restored = learner(settings)
    restored.load_state_dict(load(blob))
    assert restored.updates == 2
    _continue_identically(original, restored)


def test_torch_backend_checkpoint_resumes_under_zero():
    original = learner(LearnerBackendConfig())
    trajectory(original, [0, 1])
    assert isinstance(original.backend, TorchAdam)
    state = original.state_dict()  # no fp32 masters: ZeRO takes them from the loaded weights
    restored = learner(deepspeed(1))
    restored.load_state_dict(state)
    np.testing.assert_allclose(trajectory(restored, [7, 8]), trajectory(original, [7, 8]), rtol=1e-5, atol=1e-6)


def test_native_deepspeed_checkpoint_round_trip(tmp_path):
    original = learner(deepspeed(1))
    trajectory(original, [0, 1])
    original.backend.save_checkpoint(tmp_path, tag="iter-2")
    restored = learner(deepspeed(1))
    restored.backend.load_checkpoint(tmp_path, tag="iter-2")
    # DeepSpeed's checkpoint holds the engine (weights + optimizer); the PPO learner's own
    # counters travel in our state_dict.
    restored.generator.set_state(original.generator.get_state())
    restored.updates = original.updates
    _continue_identically(original, restored)
    with pytest.raises(LearnerBackendError, match="no DeepSpeed checkpoint"):
        restored.backend.load_checkpoint(tmp_path, tag="missing")


# ------------------------------------------------------------------------------ token PPO


def test_token_ppo_learner_runs_on_deepspeed():
    from ludus.agents.lm.model import TinyLMConfig, build_tiny_lm, frozen_copy
    from ludus.agents.rl.token_ppo import (
        TokenBatch,
        TokenPPOConfig,
        TokenPPOLearner,
        token_log_probs,
    )

    config = TokenPPOConfig(lr=3e-3, kl_beta=0.01, minibatch_size=8)
    ids = np.array([[1, 5, 3, 4, 2, 0]] * 16)
    own = np.array([[False, False, True, True, True, False]] * 16)

    def rl_update(backend_config: LearnerBackendConfig):
        model = build_tiny_lm(TinyLMConfig(vocab_size=8, n_positions=16, n_embd=32, n_layer=1, n_head=2), seed=0)
        backend = make_token_update_backend(model, config, backend_config)
        token_learner = TokenPPOLearner(model, ref_model=frozen_copy(model), config=config, seed=0, backend=backend)
        batch = TokenBatch(ids, own, *token_log_probs(model, ids), token_learner.reference_log_probs(ids),
                           np.linspace(0, 1, 16).astype(np.float32))
        stats = token_learner.update(batch)
        imitation = token_learner.imitation_update(TokenBatch.for_imitation(ids, own))
        return [stats.policy_loss, stats.value_loss, stats.grad_norm], imitation

    torch_stats, _ = rl_update(LearnerBackendConfig())
    ds_stats, imitation = rl_update(deepspeed(1))
    np.testing.assert_allclose(ds_stats, torch_stats, rtol=1e-5, atol=1e-6)
    assert np.isfinite(imitation.nll) and imitation.grad_norm > 0


# ------------------------------------------------------------------------------ text PPO (pretrained LMs)


@pytest.mark.parametrize("stage, dtype", [(0, "float32"), (1, "float32"), (2, "float32"), (1, "bfloat16")])
def test_text_ppo_learner_steps_like_torch_on_deepspeed(tiny_bases, stage, dtype):
    """The LM learner's adapters under DeepSpeed: minibatches of 12 turns in micro-batches of 5
    (5 + 5 + 2: unmanaged accumulation, a short last micro-batch) take torch Adam's steps; also
    float32 adapters on a bfloat16 base."""
    from ludus.agents.lm.pretrained import PretrainedLMConfig, load_pretrained_lm, trained_state
    from ludus.agents.lm.text_ppo import TextPPOConfig, TextPPOLearner, TurnBatch, response_log_probs

    rng = np.random.default_rng(0)
    prompts = tuple(tuple(int(t) for t in rng.integers(10, 400, size=int(rng.integers(6, 12)))) for _ in range(24))
    responses = tuple(tuple(int(t) for t in rng.integers(10, 400, size=int(rng.integers(1, 4)))) for _ in range(24))
    returns = rng.choice([-1.0, 1.0], size=24)

    def update(backend_config: LearnerBackendConfig):
        lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), dtype=dtype), seed=0)
        with torch.no_grad():
            reading = response_log_probs(lm.model, list(prompts), list(responses), 1.0)
        behaviour = tuple(reading.log_probs[i, :len(r)].numpy().copy() for i, r in enumerate(responses))
        turns = TurnBatch(prompts, responses, behaviour, returns, np.arange(24) % 2, np.zeros(24))
        config = TextPPOConfig(learning_rate=1e-2, minibatch_size=12, micro_batch_size=5, epochs=2)
        learner = TextPPOLearner(lm.model, config, temperature=1.0, num_roles=2, seed=0, backend_config=backend_config)
        stats = learner.update(turns)
        return {k: v.detach().clone() for k, v in trained_state(lm.model).items()}, stats, learner

    torch_weights, torch_stats, _ = update(LearnerBackendConfig())
    ds_weights, ds_stats, ds_learner = update(deepspeed(stage))
    assert isinstance(ds_learner.backend, DeepSpeedBackend)
    assert torch_weights.keys() == ds_weights.keys()
    adapters = [k for k in torch_weights if "lora_" in k]
    assert adapters and any(not torch.equal(torch_weights[k], ds_weights[k].new_zeros(ds_weights[k].shape))
                            for k in adapters if "lora_B" in k)  # the adapters moved off their zero init
    for k in torch_weights:
        torch.testing.assert_close(ds_weights[k], torch_weights[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ds_stats["grad_norm"], torch_stats["grad_norm"], rtol=1e-4)
    # the optimizer state round-trips in the torch layout (league checkpoints, exact resume)
    state = ds_learner.backend.state_dict()
    ds_learner.backend.load_state_dict(state)
    assert ds_learner.backend.state_dict().keys() == state.keys()


def test_lm_league_trains_on_deepspeed_and_resumes_exactly(tiny_bases, tmp_path):
    from ludus.league.api import League, load_config
    from ludus.league.check import resumed_fingerprint, run_fingerprint

    config = load_config("llm_kuhn_poker", ["learner=text_ppo", f"text_lm.model.base={tiny_bases[0]}", "iterations=2",
                                            "matches_per_iteration=16", "num_envs=16", "snapshot_every_steps=20",
                                            "log.wandb=disabled", "log.tensorboard=false", "log.progress=false",
                                            "text_lm.ppo.minibatch_size=64", "text_lm.ppo.micro_batch_size=32",
                                            "learner_backend.backend=deepspeed", "learner_backend.zero_stage=1"])
    whole = League.create(config, tmp_path / "whole")
    whole.run()
    assert isinstance(whole.learners["main"].impl.ppo.backend, DeepSpeedBackend)
    whole.close()
    rows, snapshots = run_fingerprint(tmp_path / "whole")
    assert len(snapshots) > 1 and (rows, snapshots) == resumed_fingerprint(config, tmp_path / "half")


# ------------------------------------------------------------------------------ data-parallel ranks


@pytest.mark.parametrize("stage", [1, 2])
def test_two_ranks_with_half_the_batch_take_the_one_rank_update(stage):
    """Two DeepSpeed ranks (processes, gloo on loopback), each holding half of every batch, end two
    PPO updates (4 minibatch steps each) with the weights one rank reaches on the whole batches."""
    from ludus.agents.data_parallel import max_difference, run_ranks

    settings = dict(zero_stage=stage, rows=256, minibatch=64, epochs=2, updates=2)
    two, one = run_ranks(2, **settings), run_ranks(1, **settings)
    assert max_difference(two, one) <= 1e-5
    half = run_ranks(1, **{**settings, "rows": 128})  # one rank on half the rows is another update
    assert max_difference(half, one) > 1e-3


RANKED_LEAGUE = """
import sys
from ludus.league.api import League, load_config
config = load_config("quickstart", ["iterations=3", "matches_per_iteration=64", "num_envs=32",
                                    "snapshot_every_steps=200", "log.wandb=disabled", "log.tensorboard=false",
                                    "log.progress=false", "ppo.minibatch_size=64", "learner_backend.backend=deepspeed",
                                    "learner_backend.zero_stage=1", "learner_backend.ranks=2"])
run, until = sys.argv[1], int(sys.argv[2])
league = League.resume(run) if until == 0 else League.create(config, run)
try:
    league.run(until_iteration=until or None)
    assert league.ranks is not None and league.ranks.world_size == 2
finally:
    league.close()
"""


def test_a_league_trained_on_two_ranks_resumes_exactly(tmp_path):
    """`learner_backend.ranks: 2`: the league's process and one helper rank train the learner on
    half of every batch each; a run stopped after one iteration and resumed (each part a fresh
    process, as after a kill) records the ledger and snapshots of the uninterrupted run."""
    import subprocess
    import sys

    from ludus.league.check import run_fingerprint

    def league(run: str, until: int) -> None:
        result = subprocess.run([sys.executable, "-c", RANKED_LEAGUE, str(tmp_path / run), str(until)],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]

    league("whole", 3)
    league("half", 1)
    league("half", 0)  # resume to the end
    rows, snapshots = run_fingerprint(tmp_path / "whole")
    assert len(snapshots) > 1 and (rows, snapshots) == run_fingerprint(tmp_path / "half")
