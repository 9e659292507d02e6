"""The reference of ``tools/bench_kv.py``: single-thread memcpy (``np.copyto``) of the same
byte counts, in the calling process, pinned to one core."""

from __future__ import annotations

import os

import numpy as np

from tools.bench_parts.kv.buffers import page_buffer
from tools.benchlib.timing import time_calls


def bench_memcpy(sizes: list[int], repeats: int, cpu: int) -> dict[int, list[float]]:
    """Seconds of ``repeats`` single-thread ``np.copyto`` per size (bytes), warm buffers, this
    process pinned to ``cpu`` meanwhile."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        mm_s, src = page_buffer(max(sizes))
        mm_d, dst = page_buffer(max(sizes))
        out = {}
        for size in sizes:
            def copy(size: int = size) -> None:
                np.copyto(dst[:size], src[:size])
            copy()
            out[size] = time_calls(copy, repeats)
        del src, dst, copy
        mm_s.close()
        mm_d.close()
        return out
    finally:
        os.sched_setaffinity(0, old)
