"""A pretrained LM learns tic-tac-toe in the league: its score against a random legal mover.

Trains the `llm_tic_tac_toe` preset (SmolLM2-135M-Instruct with LoRA adapters reading the board
as text and answering "[4]", learner `text_exit`: expert iteration with MCTS over the rules as the
expert) for a wall-clock budget of training time, then plays the trained LM
in both seats against a uniformly random legal mover, `--games` games per seat, and reports its
score (win 1, draw 0.5, loss 0) with a Wilson 95% interval and its legal-response rate: the share
of its turns whose FIRST response named a legal move (retries and the random fallback hide the
others from the game, not from this figure). The base model's figures (adapters off) are printed
beside them, measured on the same seeds.

    python benchmarks/llm_tictactoe.py                 # seed 0, 1800 s
    python benchmarks/llm_tictactoe.py --seed 3 --budget 600

Prints the host's CPU flags first. Ends with ``goal llm_tictactoe_steps_30min: <n> Adam steps (target
1500) PASS|FAIL`` (the learner's Adam steps within a budget of at most 30 minutes: issue 80 asks for
1,500 on a host without AMX tiles; the preset's base is float32, which no host runs on AMX tiles)
and ``goal llm_tictactoe_vs_random: score <s>, legal <l> (target 0.85, 0.99) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import host_line  # noqa: E402
from benchmarks.lm_training import budget_league, train_within  # noqa: E402

TARGET_SCORE, TARGET_LEGAL = 0.85, 0.99
TARGET_STEPS, STEPS_BUDGET = 1500, 1800.0
GAME = "tic_tac_toe"


def score_vs_random(policy, games_per_seat: int, seed: int, threads: int) -> tuple[float, float, float, float]:
    """(score, Wilson low, Wilson high, legal-response rate) of `policy` against the random mover."""
    from ludus.agents.policy import RandomPolicy
    from ludus.evaluation.evaluate import evaluate_policies

    policy.counts = {key: 0 for key in policy.counts}
    (result,) = evaluate_policies(GAME, policy, {"random": RandomPolicy()}, 2 * games_per_seat, seed=seed,
                                  num_envs=200, threads=threads)
    legal = policy.counts["first_valid"] / max(policy.counts["turns"], 1)
    return result.score, result.lower, result.upper, legal


def adam_steps(optimizer) -> int:
    """Steps `optimizer` (a `torch.optim.Adam`) has taken: its own count."""
    counts = {int(state["step"]) for state in optimizer.state.values()}
    if len(counts) > 1:
        raise ValueError(f"the adapters' parameters took different numbers of Adam steps: {sorted(counts)}")
    return counts.pop() if counts else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=1800.0, help="training seconds")
    parser.add_argument("--games", type=int, default=400, help="games per seat against the random mover")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    import torch

    from ludus.agents.lm.pretrained import adapter_disabled
    from ludus.agents.lm.text_policy import TextLMPolicy

    print(host_line(), flush=True)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="ludus-llm-ttt-")) / "run"
    league = budget_league("llm_tic_tac_toe", args.seed, run_dir, args.overrides)
    torch.set_num_threads(league.config.torch_threads)
    learner = league.learners["main"].impl
    policy = TextLMPolicy(learner.lm.model, learner.lm.tokenizer, learner.view, learner.text.play)
    try:
        trained_seconds, iterations = train_within(league, args.budget)
    finally:
        league.close()
    threads = league.config.torch_threads
    steps = adam_steps(learner.exit.optimizer.optimizer)
    trained = score_vs_random(policy, args.games, seed=1000 + args.seed, threads=threads)
    with adapter_disabled(learner.lm.model):
        base = score_vs_random(policy, args.games, seed=1000 + args.seed, threads=threads)
    for name, (score, low, high, legal) in (("trained", trained), ("base", base)):
        print(f"{name}: score {score:.3f} [{low:.3f}, {high:.3f}] over {2 * args.games} games, legal {legal:.4f}")
    print(f"{iterations} iterations in {trained_seconds:.0f} s of training (load {os.getloadavg()[0]:.1f})")
    counted = args.budget <= STEPS_BUDGET and trained_seconds <= args.budget
    print(f"goal llm_tictactoe_steps_30min: {steps} Adam steps in {trained_seconds:.0f} s (target {TARGET_STEPS} "
          f"within {STEPS_BUDGET:.0f} s) {'PASS' if counted and steps >= TARGET_STEPS else 'FAIL'}")
    ok = trained[0] >= TARGET_SCORE and trained[3] >= TARGET_LEGAL and trained_seconds <= args.budget
    print(f"goal llm_tictactoe_vs_random: score {trained[0]:.3f}, legal {trained[3]:.4f} "
          f"(target {TARGET_SCORE}, {TARGET_LEGAL}) {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
