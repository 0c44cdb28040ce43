"""Connect four learning check: a short league on the `connect_four` preset must clearly beat random play.

Slow (about a minute on a quiet 2-core machine, a few under load): CI runs it in its second pass
(`pytest -m slow`). The full skill figures (against OpenSpiel MCTS) come from
benchmarks/connect_four_skill.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from ludus.agents.bots.builtin import make_bot
from ludus.agents.nets import ActorCritic
from ludus.agents.torch_policy import TorchPolicy
from ludus.evaluation.evaluate import evaluate_policies
from ludus.games.registry import spec as game_spec
from ludus.league.config import load_config
from ludus.league.manager import League

ITERATIONS = 20


def _win_rate_vs_random(net: ActorCritic, greedy: bool) -> tuple[float, tuple[float, ...]]:
    spec = game_spec("connect_four")
    result, = evaluate_policies("connect_four", TorchPolicy(net), {"random": make_bot("random", spec)},
                                games_per_opponent=400, seed=7, greedy=greedy)
    return result.wins / result.games, result.seat_scores


@pytest.mark.slow
def test_short_connect_four_league_beats_random(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    # The preset as users run it (runner processes, async pipeline, all three roles, the MCTS
    # anchors), only shorter and without logging sinks.
    config = load_config("connect_four", [f"iterations={ITERATIONS}", "log.wandb=disabled",
                                          "log.tensorboard=false", "log.progress=false"])
    league = League.create(config, tmp_path / "run")
    try:
        summaries = league.run()
    finally:
        league.close()
    assert len(summaries) == ITERATIONS
    assert sum(s.dropped_transitions for s in summaries) == 0  # async lag stays within max_policy_lag

    run_dir = tmp_path / "run"
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    state = load_file(str(run_dir / pointer["path"] / "learner-main.safetensors"))
    spec = game_spec("connect_four")
    trained = ActorCritic(spec, config.net)
    trained.load_state_dict({k[len("net."):]: v for k, v in state.items() if k.startswith("net.")})
    trained.eval()
    torch.manual_seed(0)
    untrained = ActorCritic(spec, config.net).eval()

    # An untrained net already wins ~78% greedily (a fixed column choice stacks four against a
    # random player that rarely blocks) and ~50% sampling, so both modes are compared with it.
    before_greedy, _ = _win_rate_vs_random(untrained, greedy=True)
    before_sampling, _ = _win_rate_vs_random(untrained, greedy=False)
    greedy, greedy_seats = _win_rate_vs_random(trained, greedy=True)
    sampling, _ = _win_rate_vs_random(trained, greedy=False)
    assert greedy >= 0.9 and min(greedy_seats) >= 0.8, (greedy, greedy_seats, before_greedy)
    assert sampling >= 0.75, (sampling, before_sampling)
    assert greedy >= before_greedy + 0.08 and sampling >= before_sampling + 0.2
