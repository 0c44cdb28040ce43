"""Connect four learning check: a short league on the `connect_four` preset must clearly beat random play.

Slow (a few minutes on 2 cores): CI runs it in its second pass (`pytest -m slow`). The full skill
figures (against OpenSpiel MCTS) come from benchmarks/connect_four_skill.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from agents.bots import make_bot
from agents.nets import ActorCritic
from agents.torch_policy import TorchPolicy
from evaluation.evaluate import evaluate_policies
from games.registry import spec as game_spec
from league.config import load_config
from league.manager import League


@pytest.mark.slow
def test_short_connect_four_league_beats_random(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    # The preset as users run it (process runners, async pipeline, all three roles, MCTS
    # anchor), only shorter and without logging sinks.
    config = load_config("connect_four", ["iterations=12", "log.wandb=disabled", "log.tensorboard=false",
                                          "log.progress=false"])
    league = League.create(config, tmp_path / "run")
    try:
        summaries = league.run()
    finally:
        league.close()
    assert len(summaries) == 12
    assert all(s.dropped_transitions == 0 for s in summaries)

    run_dir = tmp_path / "run"
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    state = load_file(str(run_dir / pointer["path"] / "learner-main.safetensors"))
    spec = game_spec("connect_four")
    net = ActorCritic(spec, config.net)
    net.load_state_dict({k[len("net."):]: v for k, v in state.items() if k.startswith("net.")})
    net.eval()

    def vs_random(module: torch.nn.Module) -> float:
        result, = evaluate_policies("connect_four", TorchPolicy(module), {"random": make_bot("random", spec)},
                                    games_per_opponent=400, seed=7, greedy=True)
        assert min(result.seat_scores) > 0.5, result  # better than random from both seats
        return result.wins / result.games

    torch.manual_seed(0)
    untrained = vs_random(ActorCritic(spec, config.net).eval())
    trained = vs_random(net)
    assert trained >= 0.8, f"main agent won {trained:.1%} of games against random (untrained net: {untrained:.1%})"
    assert trained > untrained + 0.15
