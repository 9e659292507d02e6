"""Summaries of repeated measurements: medians over runs, percentiles, ratios."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any


def median_of(runs: Iterable[dict[str, Any]], key: str, sub: str | None = None) -> Any:
    """Median over ``runs`` of ``run[key]`` (``run[key][sub]`` with ``sub``), runs without a value
    left out; None where none has one."""
    vals = []
    for r in runs:
        v = r.get(key) if sub is None else (r.get(key) or {}).get(sub)
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The ``q``-th percentile (numpy's linear interpolation) of the values that are not None;
    None where there are none."""
    import numpy as np

    v = np.asarray([x for x in values if x is not None], dtype=float)
    return float(np.percentile(v, q)) if v.size else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``b / a``; None where either is missing or ``a`` is 0."""
    return b / a if a not in (None, 0) and b is not None else None
