"""A pretrained LM learns to negotiate in plain English in the league: its own-score gain over the
untrained base model, both playing against the base model.

Trains the `llm_negotiation` preset (SmolLM2-135M-Instruct with LoRA adapters; one utterance per
turn, "[propose: 2 books, 1 hat, 0 balls]" or "[accept]", games/builtin/negotiation_turns.py and the English
view in games/text.py) for a wall-clock budget of training time. Then, duplicate pairs: for every
evaluation context and seat, the trained LM plays that seat against the base model (adapters as
initialised: the untrained model), and the base model plays the same seat of the same context
against the base model. The gain of a pair is the trained LM's own score minus the base model's;
the figure is the mean gain over pairs with a normal 95% interval. Agreement rates are printed
beside it.

    python benchmarks/llm_negotiation.py                 # seed 0, 1800 s, 200 contexts x 2 seats
    python benchmarks/llm_negotiation.py --seed 3 --budget 600 --contexts 100
    python benchmarks/llm_negotiation.py --evaluate RUN_DIR     # a finished run's learner, no training

With `--evaluate` the learner is the one in the run's last checkpoint and the base is its first
snapshot ('main@0', the adapters as initialised), so a run of this script (`--run-dir`, whose
budget it enforced) can be measured again on more contexts.

Ends with ``goal llm_negotiation_gain: <gain> [low, high] (target lower bound >= 0.5) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lm_training import budget_league, train_within  # noqa: E402

TARGET_LOWER = 0.5
SEED = 0
BUDGET = 1800.0
"""Training defaults: seed, and seconds of training (the goal's 30 minutes)."""
GAME = "negotiation_turns"


def paired_scores(trained, base, contexts: int, seed: int, threads: int) -> dict[str, np.ndarray]:
    """Own scores per (context, seat): 'trained' (trained LM vs base) and 'base' (base vs base, the
    same contexts and seats), plus whether each game ended in a deal."""
    from ludus.evaluation.evaluate import pair_seed, paired_assignments, play_assignments
    from ludus.games.builtin.negotiation_turns import DEAL

    players = {"trained": trained, "base_seat": base, "partner": base}
    out = {}
    for name in ("trained", "base_seat"):
        assignments = paired_assignments(name, ["partner"], 2 * contexts, 2, seed)
        matches = play_assignments(GAME, assignments, players, sample_seed=pair_seed(seed, 1 << 30), num_envs=256,
                                   threads=threads)
        matches = sorted(matches, key=lambda m: m.assignment.match_id)
        seats = [m.assignment.players.index(name) for m in matches]
        out[name] = np.array([m.returns[s] for m, s in zip(matches, seats)], dtype=np.float64)
        out[name + "_deal"] = np.array([bool(m.moves) and m.moves[-1] == DEAL for m in matches])
    return out


def finished_run(run_dir: Path):
    """(league, initial adapters) of a finished run: the league as of its last checkpoint (closed
    again at once: only its learner is used) and the tensors of its first snapshot."""
    from ludus.agents.lm.snapshots import read_adapter_snapshot
    from ludus.league.api import League
    from ludus.league.rundata import read_run

    league = League.resume(run_dir)
    league.close()
    first = read_run(run_dir).member("main@0")
    if first is None or first.snapshot_path is None:
        raise SystemExit(f"{run_dir}: no snapshot 'main@0' (the learner's initial adapters) in this run")
    initial = read_adapter_snapshot(Path(run_dir) / first.snapshot_path).tensors
    return league, initial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # None = not given: --evaluate refuses them, training falls back to the defaults
    parser.add_argument("--seed", type=int, default=None, help=f"training seed (default {SEED})")
    parser.add_argument("--budget", type=float, default=None, help=f"training seconds (default {BUDGET:.0f})")
    parser.add_argument("--contexts", type=int, default=200, help="evaluation contexts (each played in both seats)")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--evaluate", type=Path, default=None, metavar="RUN_DIR",
                        help="evaluate this finished run's learner (its seed is the run's) instead of training")
    args = parser.parse_args()
    training = {"--seed": args.seed, "--budget": args.budget, "--run-dir": args.run_dir, "--set": args.overrides}
    if args.evaluate is not None and any(v not in (None, []) for v in training.values()):
        parser.error(f"--evaluate measures a finished run as it was trained; drop "
                     f"{', '.join(k for k, v in training.items() if v not in (None, []))}")

    import torch

    from ludus.agents.lm.pretrained import trained_state
    from ludus.agents.lm.text_policy import TextLMPolicy

    if args.evaluate is None:
        run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="ludus-llm-negotiation-")) / "run"
        seed = SEED if args.seed is None else args.seed
        league = budget_league("llm_negotiation", seed, run_dir, args.overrides)
        initial = {k: v.clone() for k, v in trained_state(league.learners["main"].impl.lm.model).items()}
        try:
            trained_seconds, iterations = train_within(league, BUDGET if args.budget is None else args.budget)
        finally:
            league.close()
    else:
        league, initial = finished_run(args.evaluate)
        iterations, seed = league.iteration, league.config.seed
    torch.set_num_threads(league.config.torch_threads)
    learner = league.learners["main"].impl
    lm = learner.lm
    final = {k: v.clone() for k, v in trained_state(lm.model).items()}
    if set(initial) != set(final):
        raise SystemExit("the first snapshot's tensors are not the learner's adapters (another preset's run?)")
    play = learner.text.play
    trained = TextLMPolicy(lm.model, lm.tokenizer, learner.view, play, adapters=final)
    base = TextLMPolicy(lm.model, lm.tokenizer, learner.view, play, adapters=initial)
    start = time.perf_counter()
    scores = paired_scores(trained, base, args.contexts, seed=1000 + seed, threads=league.config.torch_threads)
    gains = scores["trained"] - scores["base_seat"]
    mean = float(gains.mean())
    half = 1.96 * float(gains.std(ddof=1)) / np.sqrt(len(gains))
    print(f"trained vs base: own score {scores['trained'].mean():.3f}, deals {scores['trained_deal'].mean():.3f}")
    print(f"base vs base:    own score {scores['base_seat'].mean():.3f}, deals {scores['base_seat_deal'].mean():.3f}")
    trained_for = (f"{iterations} iterations in {trained_seconds:.0f} s of training" if args.evaluate is None else
                   f"the learner of {args.evaluate} after {iterations} iterations")
    print(f"{len(gains)} pairs evaluated in {time.perf_counter() - start:.0f} s; {trained_for} "
          f"(load {os.getloadavg()[0]:.1f})")
    ok = mean - half >= TARGET_LOWER
    print(f"goal llm_negotiation_gain: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] "
          f"(target lower bound >= {TARGET_LOWER}) {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
