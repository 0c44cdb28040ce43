"""Ludus's one native extension (agents/grouped_linear.cpp): the layers of many small nets of one
shape in one call, each net's rows times its own weights, for `ludus.agents.nets.StackedActors`.

It has a kernel per kind of CPU, a *path*, chosen at run time for the nets' dtype:

* `"amx"` — bfloat16 on the BRGeMM micro-kernels inside libtorch, on AMX tiles (where oneDNN
  can pack bf16 weights for them);
* `"avx512bf16"` — bfloat16 on our own `vdpbf16ps` micro-kernel (AVX512-BF16, no AMX needed);
* `"avx2"` — float32 on our own FMA micro-kernel (AVX2 with FMA).

`grouped_path(dtype)` names the path a stack of `dtype` nets takes on this CPU (None: the stack
keeps `torch.baddbmm`, which gives the same logits up to a rare last bit; tests/test_policy.py),
and `grouped_linear_status()` says in one line what this host runs (the self-play benchmarks
print it). The extension is built on first use with torch's own extension builder
(`torch.utils.cpp_extension`, with ninja and a C++ compiler: ~10 s; then cached under
`TORCH_EXTENSIONS_DIR`, ~/.cache/torch_extensions by default, and loaded in ~0.1 s); without a
compiler every stack keeps `baddbmm`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("grouped_linear.cpp")

PATHS = {
    "amx": (torch.bfloat16, "AMX tiles (oneDNN BRGeMM)", "pack_weights", "grouped_linear"),
    "avx512bf16": (torch.bfloat16, "AVX512-BF16 (own vdpbf16ps kernel)", "pack_weights_avx512bf16",
                   "grouped_linear_avx512bf16"),
    "avx2": (torch.float32, "AVX2 (own FMA kernel)", "pack_weights_avx2", "grouped_linear_avx2"),
}
"""Each path's (dtype, what it runs on, packing op, product op), fastest first for each dtype: the
ops are `torch.ops.ludus.<name>`; packing takes weights [nets, in, out] of the path's dtype."""


@functools.cache
def _build_error() -> str:
    """'' once the extension is loaded, else why it could not be built (one line)."""
    if hasattr(torch.ops.ludus, "kernel_paths"):
        return ""
    try:
        from torch.utils.cpp_extension import load
        load(name="ludus_grouped_linear", sources=[str(SOURCE)], extra_cflags=["-O3"],
             is_python_module=False, verbose=False)
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no headers, a failed build
        first = str(error).strip().splitlines()
        return first[0] if first else type(error).__name__
    return ""


@functools.cache
def grouped_paths() -> tuple[str, ...]:
    """The paths this CPU runs, in `PATHS`' order; () where the extension is not built."""
    if _build_error():
        return ()
    runs = set(torch.ops.ludus.kernel_paths())
    return tuple(path for path in PATHS if path in runs)


def grouped_path(dtype: torch.dtype) -> str | None:
    """The path a stack of `dtype` nets takes on this CPU, or None (the `baddbmm` stack)."""
    return next((path for path in grouped_paths() if PATHS[path][0] == dtype), None)


@functools.cache
def grouped_linear_status() -> str:
    """What the stack runs on this host, in one line: 'ready: ...' naming each dtype's path, or
    why no path is used."""
    if _build_error():
        return f"not built ({_build_error()})"
    described = [f"{'bfloat16' if dtype == torch.bfloat16 else 'float32'} nets on {PATHS[path][1]}"
                 for dtype in (torch.bfloat16, torch.float32) if (path := grouped_path(dtype))]
    if not described:
        return "not used (this CPU has neither AMX tiles, AVX512-BF16 nor AVX2 with FMA)"
    if grouped_path(torch.bfloat16) is None:
        described.append("bfloat16 nets on baddbmm (this CPU has neither AMX tiles nor AVX512-BF16)")
    return "ready: " + ", ".join(described)
