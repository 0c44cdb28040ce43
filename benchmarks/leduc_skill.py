"""Skill on Leduc poker: exploitability of the league's output policy after 10 minutes, with
OpenSpiel's NFSP trained for the same wall time beside it.

Trains the `leduc_poker` preset for each seed (benchmarks/poker_skill.py: each seed in its own
process, measured exactly with OpenSpiel's best responses, the clock paused while measuring), then
OpenSpiel's PyTorch NFSP with its Leduc example's settings for the same training time
(benchmarks/nfsp_reference.py), one process at a time so that both get the same core.

    python benchmarks/leduc_skill.py                         # 3 seeds x 600 s, then NFSP 600 s
    python benchmarks/leduc_skill.py --seeds 3 4 --budget 300 --nfsp-seeds 1

Ends with ``goal leduc_exploitability: <worst final output exploitability over seeds> (target 0.2) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.poker_skill import add_arguments, report, train_seeds  # noqa: E402

TARGET = 0.20
STRETCH = 0.10


def nfsp(budget: float, seed: int) -> dict:
    """OpenSpiel's NFSP on Leduc for `budget` training seconds, in its own process."""
    command = [sys.executable, str(Path(__file__).resolve().parent / "nfsp_reference.py"), "--game", "leduc_poker",
               "--budget", str(budget), "--seed", str(seed)]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, "leduc_poker")
    parser.add_argument("--nfsp-seeds", type=int, nargs="*", default=[0],
                        help="seeds of the NFSP reference (none: skip it)")
    args = parser.parse_args(argv)

    from ludus.agents.solvers.exploitability import exploitability
    from ludus.agents.policy import RandomPolicy

    uniform = exploitability("spiel:leduc_poker", RandomPolicy())
    results, loads = train_seeds(args)
    references = [nfsp(args.budget, seed) for seed in args.nfsp_seeds]
    print(f"references: uniform random {uniform:.4f} (measured here)")
    for ref in references:
        trace = "  ".join(f"{r['train_seconds']:.0f}s {r['exploitability']:.3f}" for r in ref["trace"])
        print(f"  OpenSpiel NFSP (PyTorch, leduc_nfsp settings) seed {ref['seed']}, {ref['budget']:.0f} s of "
              f"training, {ref['episodes']:,} episodes: final {ref['final']:.4f}  ({trace})")
    worst = report(results, loads, f"Leduc poker, preset {args.preset}", TARGET)
    if references:
        print(f"\nNFSP in the same training time: {max(r['final'] for r in references):.4f} (worst of "
              f"{len(references)} seed(s))")
    print(f"worst final output exploitability {worst:.4f} = {uniform / worst:.1f}x below uniform random "
          f"(stretch target {STRETCH})")
    print(f"goal leduc_exploitability: {worst:.4f} (target {TARGET}) {'PASS' if worst <= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
