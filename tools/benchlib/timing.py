"""Timing a callable with ``time.perf_counter``."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_call(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def time_calls(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds each of ``repeats`` successive ``fn()`` calls took."""
    return [time_call(fn) for _ in range(repeats)]
