"""Ludus's one native kernel, `torch.ops.ludus.grouped_linear` (agents/grouped_linear.cpp): the
bfloat16 layers of many small nets in one call, on the BRGeMM micro-kernels inside libtorch.

It is built on first use with torch's own extension builder (`torch.utils.cpp_extension`, with
ninja and a C++ compiler: ~5 s; then cached under `TORCH_EXTENSIONS_DIR`,
~/.cache/torch_extensions by default, and loaded in ~0.1 s). Without a compiler, or on a CPU whose oneDNN cannot pack bf16
weights for its tiles (no AMX), `grouped_linear_available()` is False and
`ludus.agents.nets.StackedActors` keeps its `torch.baddbmm` path, which gives the same logits up to
a rare last bit (tests/test_policy.py). The self-play benchmarks print which path ran.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("grouped_linear.cpp")


@functools.cache
def grouped_linear_status() -> str:
    """"ready", or why the kernel is not used here (one line)."""
    if not hasattr(torch.ops.ludus, "grouped_linear"):
        try:
            from torch.utils.cpp_extension import load
            load(name="ludus_grouped_linear", sources=[str(SOURCE)], extra_cflags=["-O3"],
                 is_python_module=False, verbose=False)
        except (OSError, RuntimeError, ImportError) as error:  # no compiler, no headers, a failed build
            first = str(error).strip().splitlines()
            return f"not built ({first[0] if first else type(error).__name__})"
    if not torch.ops.ludus.could_pack():
        return "not used (this CPU's oneDNN cannot pack bf16 weights for AMX tiles)"
    return "ready"


def grouped_linear_available() -> bool:
    """Whether `torch.ops.ludus.grouped_linear` is built and this CPU runs it."""
    return grouped_linear_status() == "ready"
