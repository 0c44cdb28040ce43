"""Batched KV-cache generation against a per-sample loop, on the tiny GPT-2 of a dialogue policy.

Model: GPT2Config(vocab_size=75, n_positions=128, n_embd=64, n_layer=2, n_head=4) with a value head
(113k + 65 parameters; docs/reference.md §3), random weights. Workload: 32 prompts of 4-20
tokens, 64 new tokens each (no stop token, so both sides do the same amount of work), sampled
with the same Generator seed.

(a) batched: `LMPolicy.generate` — all 32 rows in one forward per new token, prompts left-padded,
    attention mask + position ids, one shared KV cache;
(b) naive: `LMPolicy.generate_naive` — one prompt at a time, no batching; each prompt DOES keep
    its own KV cache, so the ratio measures batching alone (a no-cache loop would be slower still).

Both consume the Generator the same way, so their tokens must be identical; the script checks.
The two run interleaved, repeat after repeat, so load from other processes hits both alike; each
figure is the median over repeats. torch uses 1 thread by default: forwards of this size are
dominated by per-call overhead, and on a shared 2-core machine a second thread mostly spins.

    python benchmarks/batched_generation.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

GOAL_RATIO = 8.0
NUM_PROMPTS = 32
NEW_TOKENS = 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each method (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    import torch

    from ludus.agents.lm.generation import LMPolicy
    from ludus.agents.lm.model import TinyLMConfig, build_tiny_lm

    torch.set_num_threads(args.threads)
    model = build_tiny_lm(TinyLMConfig(vocab_size=75, n_positions=128, n_embd=64, n_layer=2, n_head=4), seed=0)
    policy = LMPolicy(model, pad_id=0)
    prompt_rng = np.random.default_rng(0)
    prompts = [prompt_rng.integers(1, 75, size=int(prompt_rng.integers(4, 21))).tolist() for _ in range(NUM_PROMPTS)]
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters; {NUM_PROMPTS} prompts of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {NEW_TOKENS} new tokens each; "
          f"torch threads {torch.get_num_threads()}")

    # warm-up (allocator, lazy inits) and the equality check
    batched = policy.generate(prompts, NEW_TOKENS, np.random.default_rng(1), stop_token=None)
    naive = policy.generate_naive(prompts, NEW_TOKENS, np.random.default_rng(1), stop_token=None)
    same = bool(np.array_equal(batched.tokens, naive.tokens))
    print(f"identical tokens from both methods (same seed): {same}")

    times: dict[str, list[float]] = {"batched": [], "naive": []}
    for repeat in range(args.repeats):
        for name, method in (("batched", policy.generate), ("naive", policy.generate_naive)):
            start = time.perf_counter()
            method(prompts, NEW_TOKENS, np.random.default_rng(2 + repeat), stop_token=None)
            times[name].append(time.perf_counter() - start)
    tokens = NUM_PROMPTS * NEW_TOKENS
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:8s} median {median:7.3f} s  ({tokens / median:8.0f} tokens/s)  runs: "
              + " ".join(f"{v:.3f}" for v in values))
    ratio = statistics.median(times["naive"]) / statistics.median(times["batched"])
    passed = ratio >= GOAL_RATIO and same
    print(f"goal batched_generation_vs_naive: {ratio:.1f}x (target {GOAL_RATIO:g}x) {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
