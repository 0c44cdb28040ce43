"""Torch's intra-op thread count, set for a block and restored after it.

One helper for every place that pins it: the league's runners (serial and worker backends run
`runner_threads` each, so both compute the exact same floats: the thread count changes the
reduction order of matmuls), in-process evaluation, the stand-alone MAPPO trainer and the tests.
Why one thread is the usual choice: the small matrices of board-game nets gain nothing from a
second thread, and two threads contending for two busy cores made PPO updates 10-40x slower here
(measured 0.08 s vs 1-4 s per update). A pretrained LM's matrices do gain; its callers pass their
preset's `torch_threads`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(threads: int | None = 1) -> Iterator[None]:
    """Run torch on `threads` intra-op threads inside the block (None: leave them as they are)."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
