"""DeepSpeed across ranks: 2 data-parallel ranks with half the batch each vs 1 rank with the whole.

Runs `ludus.agents.data_parallel.run_ranks` (processes with gloo on loopback, ZeRO stage 1 by default:
the optimizer state is partitioned across the ranks) on a synthetic tic-tac-toe PPO batch, one
update of 2 epochs of 128-row minibatches on 1,024 rows, with 2 ranks and with 1, and compares the
weights. Prints the time of both (on this 2-core machine the ranks share the cores and gloo's
all-reduce is on top: the point here is equality, not speed).

    python benchmarks/deepspeed_ranks.py [--zero-stage 1] [--rows 1024] [--updates 1]

Ends with ``goal deepspeed_2rank_equivalence: <max abs parameter difference> (target 1e-05) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 1e-5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zero-stage", type=int, default=1)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--updates", type=int, default=1)
    args = parser.parse_args(argv)

    from ludus.agents.data_parallel import max_difference, run_ranks

    settings = dict(zero_stage=args.zero_stage, rows=args.rows, minibatch=128, epochs=2, updates=args.updates)
    two = run_ranks(2, **settings)
    one = run_ranks(1, **settings)
    difference = max_difference(two, one)
    print(f"ZeRO stage {args.zero_stage}, {args.updates} update(s) of {args.rows} rows (2 epochs, minibatches of 128)")
    print(f"2 ranks x {args.rows // 2} rows: {two.seconds:.3f} s; 1 rank x {args.rows} rows: {one.seconds:.3f} s")
    print(f"goal deepspeed_2rank_equivalence: {difference:.3g} (target {TARGET:g}) "
          f"{'PASS' if difference <= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
