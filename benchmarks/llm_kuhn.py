"""A pretrained LM learns Kuhn poker in the league: exploitability of its policy after 30 minutes.

For each seed, trains the `llm_kuhn_poker` preset (SmolLM2-135M-Instruct with LoRA adapters,
playing through the text view: "Your card: King. So far: Player 0 bets. Your legal actions:
[fold] [call]"; learner `text_mmd`, magnetic mirror descent of the LM's answers on the game tree
towards the base model's answers as magnet; its matches against itself, its snapshots, the random
mover and the untrained base rate it) for a wall-clock budget of training time (matches
included), then measures with OpenSpiel's exact best responses the exploitability of

* the trained LM: the learner's adapters at the end of the budget;
* the base model (adapters off), printed beside it.

An LM's policy at an information state is the distribution of the actions its responses parse
to, as it plays (retries and the random fallback included), computed exactly by enumerating every
response on its way to an answer (agents/lm/text_policy.py `response_action_probabilities`); the 12
information states are then scored with OpenSpiel's exact best responses. Reference on this machine: OpenSpiel NFSP with
tabular features 0.151 at 300 s; uniform random 0.458.

    python benchmarks/llm_kuhn.py                     # seeds 0 and 1, 1800 s each, one after another
    python benchmarks/llm_kuhn.py --seeds 2 --budget 600
    # the turn-level PPO runs of docs/llm.md
    python benchmarks/llm_kuhn.py --set learner=text_ppo --set matches_per_iteration=128 \
        --set num_envs=128 --set text_lm.ppo.minibatch_size=512 --set text_lm.ppo.micro_batch_size=256

Ends with ``goal llm_kuhn_exploitability: <worst over seeds> (target 0.15) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lm_training import budget_league, train_within  # noqa: E402

TARGET = 0.15


def exploitability_of_lm(policy) -> tuple[float, str]:
    """The policy's exploitability, and its probability of betting / calling at each of the 12
    information states ("Jpb:0.12": card J/Q/K, then the history, p pass, b bet)."""
    from ludus.agents.solvers.exploitability import as_tabular, exploitability

    table = as_tabular("spiel:kuhn_poker", policy)  # the LM's exact table, computed once
    cards = "JQK"
    row = " ".join(f"{cards[int(key[0])]}{key[1:] or '-'}:{table.policy_for_key(key)[1]:.2f}"
                   for key in table.state_lookup)
    return float(exploitability("spiel:kuhn_poker", table)), row


def run_seed(seed: int, budget: float, run_dir: Path, overrides: list[str], eval_every: float) -> dict:
    from ludus.agents.lm.pretrained import adapter_disabled
    from ludus.agents.lm.text_policy import TextLMPolicy

    league = budget_league("llm_kuhn_poker", seed, run_dir, overrides)
    learner = league.learners["main"].impl
    # the learner's own model, adapters as trained (the base: the same model with them off)
    policy = TextLMPolicy(learner.lm.model, learner.lm.tokenizer, learner.view, learner.text.play)
    with adapter_disabled(learner.lm.model):
        base, base_table = exploitability_of_lm(policy)
    print(f"seed {seed}: base model exploitability {base:.4f}; P(bet or call): {base_table}", flush=True)
    trace: list[tuple[int, float]] = []
    last_eval = 0.0

    def measure(trained_seconds: float) -> None:
        nonlocal last_eval
        if eval_every and trained_seconds - last_eval >= eval_every:
            last_eval = trained_seconds
            figure, table = exploitability_of_lm(policy)
            trace.append((round(trained_seconds), figure))
            print(f"seed {seed} at {trace[-1][0]} s: exploitability {figure:.4f}; P(bet or call): {table}", flush=True)

    try:
        trained_seconds, iterations = train_within(league, budget, f"seed {seed} ", measure)
    finally:
        league.close()
    trained, table = exploitability_of_lm(policy)
    print(f"seed {seed}: trained exploitability {trained:.4f}; P(bet or call): {table}", flush=True)
    result = {"seed": seed, "base": base, "trained": trained, "iterations": iterations, "trace": trace,
              "train_seconds": round(trained_seconds, 1), "load": os.getloadavg()[0]}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--budget", type=float, default=1800.0, help="training seconds per seed")
    parser.add_argument("--eval-every", type=float, default=0.0,
                        help="also measure every this many training seconds (the clock pauses meanwhile)")
    parser.add_argument("--run-root", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    root = args.run_root or Path(tempfile.mkdtemp(prefix="ludus-llm-kuhn-"))
    results = [run_seed(seed, args.budget, root / f"seed{seed}", args.overrides, args.eval_every)
               for seed in args.seeds]
    for r in results:
        print(f"seed {r['seed']}: trained {r['trained']:.4f}, base {r['base']:.4f}, {r['iterations']} iterations "
              f"in {r['train_seconds']:.0f} s (load {r['load']:.1f})")
    worst = max(r["trained"] for r in results)
    print(f"goal llm_kuhn_exploitability: {worst:.4f} (target {TARGET}) {'PASS' if worst <= TARGET else 'FAIL'}")


if __name__ == "__main__":
    main()
