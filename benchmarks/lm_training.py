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
    from ludus.league.api import League, load_config

    config = load_config(preset, [f"seed={seed}", "iterations=1000000", "log.progress=false", "log.wandb=disabled",
                                  "log.tensorboard=false", *overrides])
    return League.create(config, run_dir)


PROGRESS_KEYS = ("valid_response_rate", "mean_return", "kl_to_base", "table_exploitability", "target_gap",
                 "valid_first_token_mass", "exit_loss", "legal_first_token_mass", "response_rest_prob",
                 "searched_positions", "symmetric_positions", "buffer_positions")
"""Learner statistics printed after each iteration, where the learner reports them."""


def train_within(league, budget: float, label: str = "",
                 before_step: Callable[[float], None] | None = None) -> tuple[float, int]:
    """Run `league.step()` while the next iteration fits `budget` seconds; returns (training
    seconds, iterations). The next iteration is expected to take up to 1.5 times the longest of the
    last three (iterations vary: an LM's play slows when its answers turn invalid and are retried;
    judged by the last one alone, a run once ended 3 s past its budget). When a full one would not
    fit, a shorter one plays the training matches that fit by that estimate, if that is at least a
    quarter of the config's; then training stops. A shorter iteration's play is taken in proportion
    to its matches and every other phase (learning above all) as long as a full one's: some
    learners' updates take as long whatever the batch (`text_exit`'s fixed number of steps: with
    30% of an iteration taken as fixed, a tic-tac-toe run ended 2 s past its budget), and for the
    others this errs on the short side. A run past its budget all the same exits with an error: its
    figure would not be the goal's. `before_step(trained_seconds)` runs before each iteration with
    the training clock paused (measurements along the way)."""
    full = league.config.matches_per_iteration
    trained_seconds, iterations = 0.0, 0
    recent: list[tuple[float, float]] = []  # per iteration: (play scaled to a full one's matches, the rest)
    while True:
        play = 1.5 * max((p for p, _ in recent[-3:]), default=0.0)
        rest = 1.5 * max((r for _, r in recent[-3:]), default=0.0)
        left = budget - trained_seconds
        matches = None
        if play + rest > left:
            matches = int(full * (left - rest) / play) if play > 0 else 0
            if matches < max(1, full // 4):
                break
        if before_step is not None:
            before_step(trained_seconds)
        start = time.perf_counter()
        summary, _ = league.step(matches=matches)
        seconds = time.perf_counter() - start
        played = min(summary.phase_seconds.get("play", 0.0), seconds)
        recent.append((played * full / (matches or full), seconds - played))
        trained_seconds += seconds
        iterations += 1
        losses = summary.losses.get("main", {})
        phases = " ".join(f"{k} {v:.1f}" for k, v in summary.phase_seconds.items() if v >= 0.1)
        # text_ppo reports its turns; text_mmd its answer table (agents/lm/text_mmd.py); text_exit its searches
        shown = [(k, losses[k]) for k in PROGRESS_KEYS if k in losses]
        size = "" if matches is None else f"{matches} matches, "
        print(f"{label}it {iterations} {trained_seconds:6.0f}s ({size}{phases}) "
              + " ".join(f"{k} {v:.3f}" for k, v in shown), flush=True)
    if trained_seconds > budget:
        raise SystemExit(f"training took {trained_seconds:.0f} s, past its budget of {budget:.0f} s: the goal "
                         f"is not measured")
    return trained_seconds, iterations
