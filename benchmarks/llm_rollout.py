"""Rollout generation of a real LM: Ludus's engine against Hugging Face `generate`, same prompts.

Model: SmolLM2-135M-Instruct (the embedded base, agents/lm/pretrained.py), float32 on the CPU, with
LoRA adapters attached (rank 8 on the attention projections, still a no-op at B = 0) as a league
learner has them. Workload: 32 chat prompts that share a system prompt (the rules of a
negotiation game, as every seat of a game does) and differ in the user turn (each seat's private
values); up to 48 new tokens per row, sampled at temperature 1 without top-k/top-p, each row
stopping at the tokenizer's end-of-turn token. The figure counts the tokens each engine generated
(up to and including the stop token) per second; the two sample differently (their own random
streams), so their lengths differ by chance, which the repeats average out.

(a) Ludus: `ludus.agents.lm.generation.LMPolicy.generate` — one batch, KV cache, the shared prompt prefix and each
    distinct prompt read once (`ludus.agents.lm.prompt_cache.SharedPromptCache`), the prefix held once and read by
    all rows' queries together (agents/lm/kv_cache.py), new columns written in place, finished rows
    adding no more columns and leaving the cache with their entry, sampling with the caller's
    Generator;
(b) Hugging Face: `model.generate(do_sample=True, top_k=0, top_p=1.0)` on the same left-padded
    batch with its attention mask (KV cache on, every prompt read in full, finished rows padded
    until the last one stops).

The two run interleaved, repeat after repeat, so machine load hits both alike; the figure is the
ratio of median tokens per second.

    python benchmarks/llm_rollout.py [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

TARGET = 2.0
BATCH = 32
NEW_TOKENS = 48
SYSTEM = (
    "You are playing a negotiation game against another player. There is a pool of books, hats "
    "and balls. Each player has private values for the items: a value between 0 and 10 for each "
    "kind, and the values of the whole pool add up to 10 for each player. The players take turns "
    "to speak. On your turn you may propose a split, for example 'I propose: 2 books, 1 hat for "
    "me, the rest for you', or accept the other player's standing proposal by saying 'Deal.'. "
    "If no deal is made within six turns, both players get nothing. Your score is the total "
    "value of the items you get. Be brief: answer with one sentence.")


def prompts(tokenizer, rng: np.random.Generator) -> list[list[int]]:
    rows = []
    for _ in range(BATCH):
        values = rng.integers(0, 6, size=3)
        counts = rng.integers(1, 4, size=3)
        user = (f"The pool has {counts[0]} books, {counts[1]} hats and {counts[2]} balls. Your values: "
                f"book {values[0]}, hat {values[1]}, ball {values[2]}. The other player said: "
                f"'I propose: {rng.integers(0, counts[0] + 1)} books for me, the rest for you.' Your turn.")
        text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": user}],
                                             tokenize=False, add_generation_prompt=True)
        rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each engine (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()

    import torch

    from ludus.agents.lm.generation import LMPolicy
    from ludus.agents.lm.prompt_cache import common_prefix_length
    from ludus.agents.lm.pretrained import PretrainedLMConfig, load_pretrained_lm

    torch.set_num_threads(args.threads)
    lm = load_pretrained_lm(PretrainedLMConfig(), seed=0)
    tokenizer = lm.tokenizer
    rows = prompts(tokenizer, np.random.default_rng(0))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    policy = LMPolicy(lm.model, pad_id=pad)
    longest = max(map(len, rows))
    ids = torch.full((BATCH, longest), pad, dtype=torch.int64)
    mask = torch.zeros((BATCH, longest), dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[i, longest - len(row):] = torch.tensor(row)
        mask[i, longest - len(row):] = 1
    print(f"SmolLM2-135M-Instruct float32 + LoRA r=8; {BATCH} prompts of {min(map(len, rows))}-{longest} tokens "
          f"sharing {common_prefix_length(rows)}; up to {NEW_TOKENS} new tokens each; torch threads {torch.get_num_threads()}")

    stop = tokenizer.eos_token_id

    def ludus(seed: int) -> tuple[float, int]:
        began = time.perf_counter()
        generation = policy.generate(rows, NEW_TOKENS, np.random.default_rng(seed), stop_token=stop)
        return time.perf_counter() - began, int(generation.lengths.sum())

    def hugging_face(seed: int) -> tuple[float, int]:
        torch.manual_seed(seed)
        began = time.perf_counter()
        with torch.inference_mode():
            out = lm.model.lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                                       temperature=1.0, max_new_tokens=NEW_TOKENS, eos_token_id=stop,
                                       pad_token_id=pad)
        elapsed = time.perf_counter() - began
        new = out[:, longest:]
        # a row's tokens: up to and including its first stop token (HF pads after it)
        stopped = (new == stop).int()
        lengths = torch.where(stopped.any(dim=1), stopped.argmax(dim=1) + 1, torch.tensor(new.shape[1]))
        return elapsed, int(lengths.sum())

    ludus(0), hugging_face(0)  # warm-up
    rates: dict[str, list[float]] = {"ludus": [], "hf_generate": []}
    for repeat in range(args.repeats):
        for name, engine in (("ludus", ludus), ("hf_generate", hugging_face)):
            seconds, tokens = engine(repeat + 1)
            rates[name].append(tokens / seconds)
            print(f"repeat {repeat}: {name} {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s")
    rate = {name: statistics.median(r) for name, r in rates.items()}
    ratio = rate["ludus"] / rate["hf_generate"]
    print(f"tokens/s: ludus {rate['ludus']:.1f}, hf generate {rate['hf_generate']:.1f}")
    print(f"goal llm_rollout_vs_hf_generate: {ratio:.2f}x (target {TARGET}x) {'PASS' if ratio >= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
