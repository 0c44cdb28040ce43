"""Skill on Kuhn poker: exploitability of the PSRO league's output policy within 10 minutes.

Trains the `kuhn_poker` preset for each seed (benchmarks/poker_skill.py: each seed in its own
process, measuring exactly with OpenSpiel's best responses, the clock paused while measuring).
References on this kind of machine (docs/reference.md §2): uniform random 0.4583; PSRO with exact
best responses 0.0118 at 29 s; OpenSpiel NFSP 0.15 at 300 s.

    python benchmarks/kuhn_skill.py                      # 3 seeds x 600 s, one after another
    python benchmarks/kuhn_skill.py --parallel 2         # two seeds at a time (2 cores)
    python benchmarks/kuhn_skill.py --budget 120 --set ppo.ent_coef=0.03

Ends with ``goal kuhn_exploitability: <worst final exploitability over seeds> (target 0.05) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.poker_skill import add_arguments, report, train_seeds  # noqa: E402

TARGET = 0.05


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, "kuhn_poker")
    args = parser.parse_args(argv)

    from ludus.agents.solvers.exploitability import exploitability
    from ludus.agents.policy import RandomPolicy

    uniform = exploitability("spiel:kuhn_poker", RandomPolicy())
    results, loads = train_seeds(args)
    print(f"references: uniform random {uniform:.4f} (measured here); PSRO with exact best responses 0.0118 "
          f"at 29 s; NFSP 0.15 at 300 s (docs/reference.md)")
    worst = report(results, loads, f"Kuhn poker, preset {args.preset} (PSRO over an exact meta-game)", TARGET)
    print(f"\nworst final output exploitability {worst:.4f} = {uniform / worst:.0f}x below uniform random")
    print(f"goal kuhn_exploitability: {worst:.4f} (target {TARGET}) {'PASS' if worst <= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
