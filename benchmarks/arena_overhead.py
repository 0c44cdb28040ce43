"""Per-move overhead of the arena sandbox: a trivial Python agent sandboxed vs the same agent in-process.

Both sides answer the same tic-tac-toe decision (observation [3, 3, 3], 9 legal actions) with
examples/agents/random_python. In-process: the agent's `act` called directly. Sandboxed: one
`SandboxedAgent.request_action` round trip (encode the act line, write it to the agent's stdin
pipe, the agent host decodes it, calls the same `act`, encodes the answer; the arena polls,
reads, decodes and checks it). The figure is the difference of the medians, in microseconds.

    python benchmarks/arena_overhead.py [--moves 5000]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np

from ludus.arena.sandbox.isolation import SandboxConfig, resolve_isolation
from ludus.arena.match import MatchLimits, SandboxedAgent
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.arena.submission import validate_submission

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "examples" / "agents" / "random_python"
GAME = "tic_tac_toe"
TARGET_US = 200.0


def in_process_times(moves: int, obs: np.ndarray, legal: list[int]) -> list[float]:
    spec = importlib.util.spec_from_file_location("random_python_agent", AGENT / "agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    agent, rng = module.Agent(), np.random.default_rng(0)
    times = []
    for _ in range(moves):
        t0 = time.perf_counter()
        agent.act(obs, legal, rng=rng)
        times.append(time.perf_counter() - t0)
    return times


def sandboxed_times(moves: int, obs: np.ndarray, mask: np.ndarray) -> list[float]:
    submission = validate_submission(AGENT, GAME)
    limits = MatchLimits(time_per_move_s=5.0, overage_s=0.0)
    times = []
    with SandboxedAgent(submission, GAME, SandboxLimits(startup_timeout_s=30)) as agent:
        fault = agent.begin_match("bench", 0, 0, limits)
        assert fault is None, fault
        for _ in range(moves):
            t0 = time.perf_counter()
            outcome = agent.request_action("bench", obs, mask, limits.time_per_move_s)
            times.append(time.perf_counter() - t0)
            assert outcome.fault is None, outcome.fault
        agent.end_match("bench", (0.0, 0.0), 0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=300)
    args = parser.parse_args()
    obs = np.zeros((3, 3, 3), dtype=np.float32)
    obs[0] = 1.0
    mask = np.ones(9, dtype=bool)
    legal = list(range(9))
    print(f"isolation: {resolve_isolation(SandboxConfig()).value}; {args.moves} moves each after {args.warmup} warm-up")
    local = in_process_times(args.moves + args.warmup, obs, legal)[args.warmup:]
    boxed = sandboxed_times(args.moves + args.warmup, obs, mask)[args.warmup:]
    def us(xs: list[float], q: int) -> float:
        return 1e6 * statistics.quantiles(xs, n=100)[q - 1]

    print(f"{'':12s} {'median us':>10s} {'p10 us':>8s} {'p90 us':>8s} {'p99 us':>8s}")
    for name, xs in (("in-process", local), ("sandboxed", boxed)):
        print(f"{name:12s} {1e6 * statistics.median(xs):10.1f} {us(xs, 10):8.1f} {us(xs, 90):8.1f} {us(xs, 99):8.1f}")
    extra = 1e6 * (statistics.median(boxed) - statistics.median(local))
    verdict = "PASS" if extra <= TARGET_US else "FAIL"
    print(f"goal sandbox_move_overhead_us: {extra:.1f} (target {TARGET_US:.0f}) {verdict}")


if __name__ == "__main__":
    main()
