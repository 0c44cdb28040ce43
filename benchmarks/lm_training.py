"""What the pretrained-LM benchmarks share: a preset's league for a wall-clock budget, trained one
line per iteration (llm_kuhn.py, llm_tictactoe.py, llm_negotiation.py); the poker skill benchmarks
(poker_skill.py) build their budget leagues with `budget_league` too."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable


def budget_league(preset: str, seed: int, run_dir: Path, overrides: list[str]):
    """A new league of `preset` whose length is set by the budget, not the preset's iterations,
    with logging quiet and local; `overrides` (key=value) last."""
    from league.api import League, load_config

    config = load_config(preset, [f"seed={seed}", "iterations=1000000", "log.progress=false", "log.wandb=disabled",
                                  "log.tensorboard=false", *overrides])
    return League.create(config, run_dir)


PROGRESS_KEYS = ("valid_response_rate", "mean_return", "kl_to_base", "table_exploitability", "target_gap",
                 "valid_first_token_mass")
"""Learner statistics printed after each iteration, where the learner reports them."""


def train_within(league, budget: float, label: str = "",
                 before_step: Callable[[float], None] | None = None) -> tuple[float, int]:
    """Run `league.step()` while the next iteration fits `budget` seconds; returns (training
    seconds, iterations). The next iteration is expected to take up to 1.5 times the longest of the
    last three (iterations vary: an LM's play slows when its answers turn invalid and are retried;
    judged by the last one alone, a run once ended 3 s past its budget). `before_step(trained_seconds)`
    runs before each iteration with the training clock paused (measurements along the way)."""
    trained_seconds, iterations = 0.0, 0
    recent: list[float] = []
    while trained_seconds + 1.5 * max(recent[-3:], default=0.0) <= budget:
        if before_step is not None:
            before_step(trained_seconds)
        start = time.perf_counter()
        summary, _ = league.step()
        recent.append(time.perf_counter() - start)
        trained_seconds += recent[-1]
        iterations += 1
        losses = summary.losses.get("main", {})
        phases = " ".join(f"{k} {v:.1f}" for k, v in summary.phase_seconds.items() if v >= 0.1)
        # text_ppo reports its turns; text_mmd its answer table (agents/text_mmd.py)
        shown = [(k, losses[k]) for k in PROGRESS_KEYS if k in losses]
        print(f"{label}it {iterations} {trained_seconds:6.0f}s ({phases}) "
              + " ".join(f"{k} {v:.3f}" for k, v in shown), flush=True)
    return trained_seconds, iterations
