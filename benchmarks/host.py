"""The host line every LM benchmark prints first: CPU model and the flags that decide its matmul paths."""

from __future__ import annotations

import os

SHOWN_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def host_line() -> str:
    """The CPU model and the flags that decide the matmul paths (bfloat16 is fast only with
    avx512_bf16 or AMX tiles), from /proc/cpuinfo."""
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return f"host: {model}, {os.cpu_count()} cpus; " + " ".join(
        f"{f}={'yes' if f in flags else 'no'}" for f in SHOWN_FLAGS)
