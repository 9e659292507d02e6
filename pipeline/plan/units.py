"""Units the planner counts in, and how its reports print a duration."""

from __future__ import annotations

import math

GB = 1e9
GIB = 1024 ** 3
TIB = 1024 ** 4


def secs(seconds: float | None) -> str:
    """``seconds`` as the reports print it: ``"12.3 ms"`` below a second, ``"4.56 s"`` from one,
    ``"inf"`` for ``None`` or a non-finite value."""
    if seconds is None or not math.isfinite(seconds):
        return "inf"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"
