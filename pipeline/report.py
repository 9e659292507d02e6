"""A run's performance report: latency percentiles, stalls and worker utilisation, as JSON and PNGs.

Usage::

    python -m pipeline.report RUN_DIR [--compare OTHER_RUN_DIR] [--out DIR] [--stall-ms 60]

reads only the run's metrics tables (:mod:`pipeline.metrics`: ``RUN_DIR/metrics/requests/``
and ``RUN_DIR/metrics/workers/``) and, when present, ``RUN_DIR/summary.json``, and writes into
``RUN_DIR/report/`` (or ``--out``):

``report.json``
    the numbers (see :func:`summarize_run` for every key);
``timeline.png``
    one row per request (sorted by ``prefill_start``): queue wait (light grey), prefill (blue),
    KV hand-off (orange, disaggregated only), a tick per output token, and every gap between
    consecutive tokens longer than the stall threshold in red. Above :data:`TIMELINE_MAX_ROWS`
    requests an evenly spaced subset of rows is drawn (the title says so);
``latency.png``
    TTFT and ITL distributions (histogram and empirical CDF; ITL on a log axis), p50/p99 marked;
``utilisation.png``
    per worker over time: running batch size (solid) and KV cache usage (dashed), one panel per
    role (prefill / decode / colocated).

With ``--compare OTHER_RUN_DIR`` it also writes ``compare.json`` and ``compare.png``
(:func:`compare_reports`: RUN_DIR is "a", OTHER_RUN_DIR is "b"), e.g. a colocated and a
disaggregated run over the same input.

Definitions (all times in seconds; wall-clock epoch times in the tables, shown in the plots as
seconds since the run start = the earliest ``read_at``):

- **TTFT** (time to first token) = ``token_times[0] - prefill_start`` (queue wait excluded).
- **ITL** (inter-token latency) = the differences of consecutive ``token_times`` of one request,
  pooled over all requests. vLLM streams its outputs, and several tokens can reach the worker in
  one output with the same timestamp: those gaps are exactly 0 s and are kept (they are real:
  the tokens arrived together), so ITL percentiles count them. The log-scale ITL plots draw them
  at :data:`ZERO_GAP_PLOT_S` and say how many there are.
- **stall** = one ITL gap longer than the threshold (``stall_s``, default 0.060 s).
- **KV hand-off** = ``token_times[0] - prefill_end``: from the prefill worker having the KV ready
  to the first output token on the decode worker (transfer + decode scheduling). Disaggregated
  requests only (``prefill_end`` is null in colocated runs).
- **queue wait** = ``prefill_start - read_at``; **prefill time** = ``prefill_end -
  prefill_start`` (disaggregated only).
- **busy fraction** of a worker: its step rows sorted by ``t``; vLLM takes the step's scheduler
  stats after the step's outputs are processed, so ``running`` at row i is the state from
  ``t[i]`` until the next step ``t[i+1]``. busy = sum of ``t[i+1] - t[i]`` over the rows with
  ``running > 0``, divided by the worker's active span ``t[last] - t[first]``.
- **batch size**: ``running`` of a step; its mean is taken over the steps with ``running > 0``.

Percentiles are ``numpy.percentile`` with its default ``method="linear"`` (Hyndman & Fan type 7:
linear interpolation between the two nearest order statistics; p50 of [1, 2, 3, 4] is 2.5), over
every value (no binning). A statistic over no values is ``null`` in the JSON.

Every statistic uses every request metrics row that has the needed columns, error rows included
(an error row's tokens were really produced and timed); ``errors`` counts them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

STALL_S = 0.060
"""Default stall threshold: an ITL gap longer than this (seconds) is a stall."""

TIMELINE_MAX_ROWS = 500
"""Above this many requests the timeline draws an evenly spaced subset of this many rows."""

ZERO_GAP_PLOT_S = 1e-5
"""Where log-scale ITL plots draw gaps of 0 s (tokens that arrived together)."""

PERCENTILE_METHOD = "linear"

_COLORS = {"queue": "#cccccc", "prefill": "#1f77b4", "handoff": "#ff7f0e", "token": "#333333",
           "stall": "#d62728"}


# -- reading --------------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_run(run_path: str | Path) -> tuple[dict[str, Any], Any, dict[str, Any] | None]:
    """The run's request table (as a dict of columns: Python lists), worker table (pyarrow) and
    ``summary.json`` (or None when absent or unreadable).

    Raises:
        FileNotFoundError: the directory does not exist, or holds no request metrics.
        ValueError: the metrics files cannot be read, or hold no rows.
    """
    import pyarrow as pa

    from pipeline.metrics import read_request_metrics, read_worker_metrics

    run = Path(run_path)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory not found: {run}")
    req_dir = run / "metrics" / "requests"
    if not any(req_dir.glob("*/part-*.parquet")):
        raise FileNotFoundError(f"no request metrics in {req_dir} (not a run directory, or no row "
                                f"was served yet)")
    try:
        requests = read_request_metrics(run)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable request metrics in {req_dir}: {_one_line(exc)}") from None
    if requests.num_rows == 0:
        raise ValueError(f"request metrics in {req_dir} hold no rows")
    try:
        workers = read_worker_metrics(run)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable worker metrics in {run / 'metrics' / 'workers'}: "
                         f"{_one_line(exc)}") from None
    summary = None
    try:
        summary = json.loads((run / "summary.json").read_text())
        if not isinstance(summary, dict):
            summary = None
    except (OSError, ValueError):
        pass
    return requests.to_pydict(), workers, summary


# -- numbers --------------------------------------------------------------------------------------

def _f(x: Any) -> float | None:
    """A JSON-safe float (None for None / NaN / inf)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _pct(values: np.ndarray, q: float) -> float | None:
    if values.size == 0:
        return None
    return _f(np.percentile(values, q, method=PERCENTILE_METHOD))


def _max(values: np.ndarray) -> float | None:
    return _f(values.max()) if values.size else None


def _col(cols: dict[str, list], name: str) -> np.ndarray:
    """A numeric column as float64 with NaN for nulls."""
    return np.array([np.nan if v is None else v for v in cols[name]], dtype=np.float64)


def _token_times(cols: dict[str, list]) -> list[np.ndarray]:
    return [np.asarray(tt if tt is not None else [], dtype=np.float64) for tt in cols["token_times"]]


def run_start(cols: dict[str, list], workers: Any = None) -> float:
    """Epoch seconds of the run start: the earliest ``read_at`` (else prefill_start, first token,
    first worker step)."""
    for name in ("read_at", "prefill_start"):
        v = _col(cols, name)
        if np.isfinite(v).any():
            return float(np.nanmin(v))
    firsts = [tt[0] for tt in _token_times(cols) if tt.size]
    if firsts:
        return float(min(firsts))
    if workers is not None and workers.num_rows:
        return float(min(t for t in workers.column("t").to_pylist() if t is not None))
    return 0.0


def _latencies(cols: dict[str, list]) -> dict[str, np.ndarray]:
    tts = _token_times(cols)
    first = np.array([tt[0] if tt.size else np.nan for tt in tts])
    ps, pe, ra = _col(cols, "prefill_start"), _col(cols, "prefill_end"), _col(cols, "read_at")

    def ok(a: np.ndarray) -> np.ndarray:
        return a[np.isfinite(a)]

    gaps = [np.diff(tt) for tt in tts if tt.size > 1]
    return {
        "ttft": ok(first - ps),
        "itl": np.concatenate(gaps) if gaps else np.zeros(0),
        "itl_per_request": [np.diff(tt) if tt.size > 1 else np.zeros(0) for tt in tts],
        "handoff": ok(first - pe),
        "queue": ok(ps - ra),
        "prefill": ok(pe - ps),
    }


def worker_stats(workers: Any) -> dict[str, dict[str, Any]]:
    """Per worker id: ``role``, ``steps``, ``span_s`` (first to last step), ``busy_s``,
    ``busy_fraction`` (see the module docstring; null for a span of 0), ``mean_batch_size``
    (over steps with running > 0), ``max_batch_size``, ``max_kv_cache_usage`` (0..1),
    ``prefix_cache_queries`` / ``prefix_cache_hits`` (prompt tokens, vLLM's local prefix cache)
    and their ratio ``prefix_cache_hit_rate`` (null without queries)."""
    out: dict[str, dict[str, Any]] = {}
    if workers is None or workers.num_rows == 0:
        return out
    cols = workers.to_pydict()
    by: dict[str, list[int]] = {}
    for i, w in enumerate(cols["worker"]):
        by.setdefault(w, []).append(i)
    for w, idx in sorted(by.items(), key=lambda kv: str(kv[0])):
        t = np.array([cols["t"][i] for i in idx], dtype=np.float64)
        order = np.argsort(t, kind="stable")
        t = t[order]
        running = np.array([cols["running"][i] for i in idx], dtype=np.float64)[order]
        kv = np.array([np.nan if cols["kv_cache_usage"][i] is None else cols["kv_cache_usage"][i]
                       for i in idx], dtype=np.float64)[order]
        known = np.isfinite(running)
        # A row without scheduler stats keeps the previous row's state.
        if not known.all():
            last = np.nan
            for i in range(running.size):
                if known[i]:
                    last = running[i]
                else:
                    running[i] = last
        span = float(t[-1] - t[0]) if t.size else 0.0
        dt = np.diff(t)
        busy = float(dt[np.nan_to_num(running[:-1]) > 0].sum()) if t.size > 1 else 0.0
        active = running[np.nan_to_num(running) > 0]
        roles = {cols["role"][i] for i in idx}
        queries = int(sum(cols["prefix_cache_queries"][i] or 0 for i in idx)) if "prefix_cache_queries" in cols else 0
        hits = int(sum(cols["prefix_cache_hits"][i] or 0 for i in idx)) if "prefix_cache_hits" in cols else 0
        out[str(w)] = {
            "role": sorted(r for r in roles if r is not None)[0] if roles - {None} else None,
            "steps": len(idx),
            "span_s": span,
            "busy_s": busy,
            "busy_fraction": busy / span if span > 0 else None,
            "mean_batch_size": _f(active.mean()) if active.size else None,
            "max_batch_size": int(np.nanmax(running)) if np.isfinite(running).any() else None,
            "max_kv_cache_usage": _f(np.nanmax(kv)) if np.isfinite(kv).any() else None,
            "prefix_cache_queries": queries,
            "prefix_cache_hits": hits,
            "prefix_cache_hit_rate": hits / queries if queries else None,
        }
    return out


def summarize_run(run_path: str | Path, stall_s: float = STALL_S) -> dict[str, Any]:
    """The numbers of ``report.json`` for one run (no files written). Keys (times in seconds):

    - ``run_dir``, ``mode`` ("disaggregated" when any request has a decode worker or a
      prefill_end, else "colocated"), ``stall_threshold_s``, ``percentile_method``;
    - ``requests`` (request metrics rows), ``errors`` (rows with an error), ``prompt_tokens``,
      ``output_tokens`` (sums of the columns);
    - ``wall_s``: earliest ``read_at`` to the last output token of any request;
      ``output_tokens_per_s`` = output_tokens / wall_s;
    - ``ttft_{p50,p90,p99,max}_s``, ``itl_{p50,p90,p99,max}_s``, ``itl_gaps`` (number of gaps),
      ``itl_zero_gaps`` (gaps of exactly 0 s: tokens that arrived together);
    - ``kv_handoff_{p50,p99}_s``, ``queue_wait_{p50,p99}_s``, ``prefill_{p50,p99}_s``;
    - ``kv_total_bytes`` (sum of kv_bytes), ``kv_tokens``;
    - ``stalls`` (ITL gaps > stall_threshold_s), ``requests_with_stalls``;
    - ``prefix_cached_tokens``, ``prefix_cache_hit_rate`` = prefix_cached_tokens / prompt_tokens;
    - ``workers``: :func:`worker_stats` per worker id; ``busy_fraction`` (worker id -> fraction),
      ``mean_batch_size`` (over every worker's steps with running > 0), ``max_batch_size``,
      ``max_kv_cache_usage`` (0..1, over all workers);
    - ``run_summary``: the launcher's ``summary.json`` (null when absent).

    Raises:
        FileNotFoundError, ValueError: see :func:`load_run`.
    """
    cols, workers, run_summary = load_run(run_path)
    return _summarize(Path(run_path), cols, workers, run_summary, stall_s)


def _sum_int(cols: dict[str, list], name: str) -> int:
    return int(sum(v for v in cols[name] if v is not None))


def _summarize(run: Path, cols: dict[str, list], workers: Any, run_summary: dict | None,
               stall_s: float) -> dict[str, Any]:
    lat = _latencies(cols)
    n = len(cols["key"])
    start = run_start(cols, workers)
    lasts = [tt[-1] for tt in _token_times(cols) if tt.size]
    wall = float(max(lasts) - start) if lasts else 0.0
    output_tokens = _sum_int(cols, "output_tokens")
    prompt_tokens = _sum_int(cols, "prompt_tokens")
    cached = _sum_int(cols, "prefix_cached_tokens")
    itl = lat["itl"]
    stall_counts = [int((g > stall_s).sum()) for g in lat["itl_per_request"]]
    disagg = any(v is not None for v in cols["decode_worker"]) or \
        any(v is not None for v in cols["prefill_end"])
    ws = worker_stats(workers)
    running_all = np.zeros(0)
    if workers is not None and workers.num_rows:
        r = np.array([np.nan if v is None else v for v in workers.column("running").to_pylist()],
                     dtype=np.float64)
        running_all = r[np.nan_to_num(r) > 0]
    kv_max = [w["max_kv_cache_usage"] for w in ws.values() if w["max_kv_cache_usage"] is not None]
    batch_max = [w["max_batch_size"] for w in ws.values() if w["max_batch_size"] is not None]

    out: dict[str, Any] = {
        "run_dir": str(run),
        "mode": "disaggregated" if disagg else "colocated",
        "stall_threshold_s": float(stall_s),
        "percentile_method": f"numpy.percentile(method={PERCENTILE_METHOD!r})",
        "requests": n,
        "errors": sum(1 for e in cols["error"] if e is not None),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "wall_s": wall,
        "output_tokens_per_s": output_tokens / wall if wall > 0 else None,
    }
    for name, key in (("ttft", "ttft"), ("itl", "itl")):
        for q in (50, 90, 99):
            out[f"{key}_p{q}_s"] = _pct(lat[name], q)
        out[f"{key}_max_s"] = _max(lat[name])
    out["itl_gaps"] = int(itl.size)
    out["itl_zero_gaps"] = int((itl == 0).sum())
    for name, key in (("handoff", "kv_handoff"), ("queue", "queue_wait"), ("prefill", "prefill")):
        for q in (50, 99):
            out[f"{key}_p{q}_s"] = _pct(lat[name], q)
    out.update({
        "kv_total_bytes": _sum_int(cols, "kv_bytes"),
        "kv_tokens": _sum_int(cols, "kv_tokens"),
        "stalls": int(sum(stall_counts)),
        "requests_with_stalls": int(sum(1 for c in stall_counts if c)),
        "prefix_cached_tokens": cached,
        "prefix_cache_hit_rate": cached / prompt_tokens if prompt_tokens else None,
        "workers": ws,
        "busy_fraction": {w: s["busy_fraction"] for w, s in ws.items()},
        "mean_batch_size": _f(running_all.mean()) if running_all.size else None,
        "max_batch_size": max(batch_max) if batch_max else None,
        "max_kv_cache_usage": max(kv_max) if kv_max else None,
        "run_summary": run_summary,
    })
    return out


# -- plots ----------------------------------------------------------------------------------------

def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _ecdf(ax, values: np.ndarray, label: str, **kw) -> None:
    v = np.sort(values)
    if v.size == 0:
        return
    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label, **kw)


def _mark(ax, values: np.ndarray, unit_scale: float = 1.0, unit: str = "s") -> None:
    for q, style in ((50, "--"), (99, ":")):
        p = _pct(values, q)
        if p is not None:
            ax.axvline(max(p, ZERO_GAP_PLOT_S) if ax.get_xscale() == "log" else p, color="k",
                       linestyle=style, linewidth=1,
                       label=f"p{q} = {p * unit_scale:.3g} {unit}")


def _row_order(cols: dict[str, list]) -> np.ndarray:
    ps = _col(cols, "prefill_start")
    fallback = _col(cols, "read_at")
    keyv = np.where(np.isfinite(ps), ps, np.where(np.isfinite(fallback), fallback, np.inf))
    return np.argsort(keyv, kind="stable")


def plot_timeline(cols: dict[str, list], path: Path, stall_s: float, start: float,
                  max_rows: int = TIMELINE_MAX_ROWS) -> int:
    """Write the token timeline; returns the number of request rows drawn."""
    plt = _plt()
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    order = _row_order(cols)
    n = order.size
    sub = n > max_rows
    if sub:
        order = order[np.unique(np.linspace(0, n - 1, max_rows).round().astype(int))]
    rows = int(order.size)
    tts = _token_times(cols)
    ra, ps, pe = _col(cols, "read_at"), _col(cols, "prefill_start"), _col(cols, "prefill_end")

    height = min(3.0 + 0.03 * rows, 18.0)
    fig, ax = plt.subplots(figsize=(13, height))
    lw = max(0.5, min(6.0, 0.6 * 72 * (height - 1.5) / max(rows, 1)))  # bar width in points
    queue, prefill, handoff, stalls = [], [], [], []
    tick_x, tick_y = [], []
    for y, i in enumerate(order):
        tt = tts[i] - start
        first = tt[0] if tt.size else np.nan
        a, b, c = ra[i] - start, ps[i] - start, pe[i] - start
        if np.isfinite(a) and np.isfinite(b) and b > a:
            queue.append([(a, y), (b, y)])
        if np.isfinite(b):
            end = c if np.isfinite(c) else first  # colocated: prefill until the first token
            if np.isfinite(end):
                prefill.append([(b, y), (end, y)])
        if np.isfinite(c) and np.isfinite(first):
            handoff.append([(c, y), (first, y)])
        if tt.size:
            tick_x.append(tt)
            tick_y.append(np.full(tt.size, y))
            if tt.size > 1:
                g = np.nonzero(np.diff(tt) > stall_s)[0]
                stalls.extend([(tt[k], y), (tt[k + 1], y)] for k in g)
    for segs, key, w in ((queue, "queue", lw * 0.5), (prefill, "prefill", lw),
                         (handoff, "handoff", lw), (stalls, "stall", lw * 1.2)):
        if segs:
            ax.add_collection(LineCollection(segs, colors=_COLORS[key], linewidths=w,
                                             zorder=3 if key == "stall" else 2))
    if tick_x:
        ax.scatter(np.concatenate(tick_x), np.concatenate(tick_y), marker="|", s=(lw * 1.6) ** 2,
                   linewidths=0.4 if rows > 100 else 0.9, color=_COLORS["token"], zorder=2.5)
    ax.autoscale_view()
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("request (sorted by prefill start)")
    title = f"token timeline: {rows} requests"
    if sub:
        title = f"token timeline: {rows} of {n} requests (evenly spaced subset; sorted by prefill start)"
    ax.set_title(title + f"; stall = gap > {stall_s * 1e3:g} ms")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [Line2D([], [], color=_COLORS["queue"], lw=3, label="queue wait"),
               Line2D([], [], color=_COLORS["prefill"], lw=3,
                      label="prefill" if handoff else "prefill (colocated: until first token)"),
               Line2D([], [], color=_COLORS["handoff"], lw=3, label="KV hand-off"),
               Line2D([], [], color=_COLORS["token"], marker="|", lw=0, label="output token"),
               Line2D([], [], color=_COLORS["stall"], lw=3, label=f"stall (> {stall_s * 1e3:g} ms)")]
    if not handoff:
        del handles[2]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3 / height * 3),
              ncol=len(handles), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return rows


def _log_itl(itl: np.ndarray) -> np.ndarray:
    return np.maximum(itl, ZERO_GAP_PLOT_S)


def plot_latency(lat: dict[str, np.ndarray], path: Path, stall_s: float) -> None:
    """TTFT (linear) and ITL (log x) histograms and CDFs, p50/p99 marked."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ttft, itl = lat["ttft"], lat["itl"]
    zeros = int((itl == 0).sum())
    ax = axes[0, 0]
    if ttft.size:
        ax.hist(ttft, bins=min(50, max(5, ttft.size)), color=_COLORS["prefill"], alpha=0.8)
    _mark(ax, ttft)
    ax.set(title=f"TTFT histogram ({ttft.size} requests)", xlabel="TTFT (s)", ylabel="requests")
    ax = axes[1, 0]
    _ecdf(ax, ttft, "TTFT", color=_COLORS["prefill"])
    _mark(ax, ttft)
    ax.set(title="TTFT CDF", xlabel="TTFT (s)", ylabel="fraction of requests", ylim=(0, 1.02))

    zero_note = (f"; {zeros} gap{'s' if zeros > 1 else ''} of 0 s drawn at {ZERO_GAP_PLOT_S:g} s"
                 if zeros else "")
    ax = axes[0, 1]
    ax.set_xscale("log")
    if itl.size:
        v = _log_itl(itl)
        lo, hi = v.min(), v.max()
        bins = np.logspace(np.log10(lo), np.log10(hi * 1.0001 if hi > lo else lo * 10), 60)
        ax.hist(v, bins=bins, color=_COLORS["handoff"], alpha=0.8)
    _mark(ax, itl, 1e3, "ms")
    ax.axvline(stall_s, color=_COLORS["stall"], linewidth=1, label=f"stall threshold {stall_s * 1e3:g} ms")
    ax.set(title=f"ITL histogram ({itl.size} gaps{zero_note})", xlabel="ITL (s, log)", ylabel="gaps")
    ax = axes[1, 1]
    ax.set_xscale("log")
    _ecdf(ax, _log_itl(itl), "ITL", color=_COLORS["handoff"])
    _mark(ax, itl, 1e3, "ms")
    ax.axvline(stall_s, color=_COLORS["stall"], linewidth=1, label=f"stall threshold {stall_s * 1e3:g} ms")
    ax.set(title="ITL CDF", xlabel="ITL (s, log)", ylabel="fraction of gaps", ylim=(0, 1.02))
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_utilisation(workers: Any, path: Path, start: float) -> None:
    """One panel per role: running batch size per worker (solid, left axis) and KV cache usage
    (dashed, right axis, %), over seconds since run start."""
    plt = _plt()
    cols = workers.to_pydict() if workers is not None and workers.num_rows else None
    roles = sorted({r for r in cols["role"] if r is not None}, key=lambda r: (
        ["prefill", "decode", "colocated"].index(r) if r in ("prefill", "decode", "colocated") else 9, r)) \
        if cols else []
    fig, axes = plt.subplots(max(1, len(roles)), 1, figsize=(12, 3.2 * max(1, len(roles))),
                             squeeze=False, sharex=True)
    if not roles:
        ax = axes[0, 0]
        ax.text(0.5, 0.5, "no worker metrics in this run", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
    cmap = plt.get_cmap("tab10")
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(cols["worker"], cols["role"]) if cols else ()):
        groups.setdefault(key, []).append(i)
    for ax, role in zip(axes[:, 0], roles):
        ax2 = ax.twinx()
        names = sorted(w for (w, r) in groups if r == role)
        for k, name in enumerate(names):
            idx = groups[(name, role)]
            t = np.array([cols["t"][i] for i in idx], dtype=np.float64)
            o = np.argsort(t, kind="stable")
            t = t[o] - start
            run = np.array([np.nan if cols["running"][i] is None else cols["running"][i] for i in idx])[o]
            kv = np.array([np.nan if cols["kv_cache_usage"][i] is None else cols["kv_cache_usage"][i]
                           for i in idx])[o]
            color = cmap(k % 10)
            ax.step(t, run, where="post", color=color, linewidth=1, label=f"{name} running")
            ax2.step(t, kv * 100, where="post", color=color, linewidth=1, linestyle="--", alpha=0.7,
                     label=f"{name} KV cache")
        ax.set_ylabel("running requests")
        vals = np.array([np.nan if cols["running"][i] is None else cols["running"][i]
                         for name in names for i in groups[(name, role)]], dtype=np.float64)
        top = float(np.nanmax(vals)) if np.isfinite(vals).any() else 1.0
        ax.set_ylim(0, max(1.0, top) * 1.1)
        ax2.set_ylabel("KV cache usage (%)")
        ax2.set_ylim(0, 110)
        ax.set_title(f"{role} workers: batch size (solid) and KV cache usage (dashed)")
        ax.grid(alpha=0.3)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        if len(names) <= 12:
            ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left", bbox_to_anchor=(1.07, 1.0),
                      borderaxespad=0)
    axes[-1, 0].set_xlabel("seconds since run start")
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


# -- the report -----------------------------------------------------------------------------------

def write_report(run_path: str | Path, out_dir: str | Path | None = None,
                 stall_s: float = STALL_S) -> dict[str, Any]:
    """Write ``report.json``, ``timeline.png``, ``latency.png`` and ``utilisation.png`` for the
    run in ``run_path`` into ``out_dir`` (default ``RUN_DIR/report/``).

    ``stall_s``: the stall threshold in seconds (an ITL gap longer than this is a stall).
    Returns the content of ``report.json``: :func:`summarize_run`'s keys plus ``timeline_rows``
    (request rows drawn in the timeline), ``timeline_subsampled`` and ``files`` (name -> path).

    Raises:
        FileNotFoundError: no such directory, or no request metrics in it.
        ValueError: unreadable metrics, or no rows.
    """
    run = Path(run_path)
    cols, workers, run_summary = load_run(run)
    out = Path(out_dir) if out_dir is not None else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    report = _summarize(run, cols, workers, run_summary, stall_s)
    start = run_start(cols, workers)
    files = {name: out / f"{name}.png" for name in ("timeline", "latency", "utilisation")}
    report["timeline_rows"] = plot_timeline(cols, files["timeline"], stall_s, start)
    report["timeline_subsampled"] = report["timeline_rows"] < report["requests"]
    plot_latency(_latencies(cols), files["latency"], stall_s)
    plot_utilisation(workers, files["utilisation"], start)
    files = {"report": out / "report.json", **files}
    report["files"] = {k: str(v) for k, v in files.items()}
    _write_json(files["report"], report)
    return report


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


# -- comparing two runs ---------------------------------------------------------------------------

RATIO_KEYS = ("output_tokens_per_s", "ttft_p99_s", "itl_p99_s", "itl_max_s", "stalls")
"""The ratios b / a in ``compare.json``."""

SIDE_BY_SIDE_KEYS = (
    "mode", "requests", "errors", "output_tokens", "wall_s", "output_tokens_per_s",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_max_s",
    "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s",
    "kv_handoff_p50_s", "kv_handoff_p99_s", "queue_wait_p50_s", "queue_wait_p99_s",
    "prefill_p50_s", "prefill_p99_s", "kv_total_bytes", "stalls", "requests_with_stalls",
    "prefix_cache_hit_rate", "mean_batch_size", "max_batch_size", "max_kv_cache_usage",
)


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return _f(b / a)


def compare_reports(run_a: str | Path, run_b: str | Path, out_dir: str | Path,
                    labels: Sequence[str] = ("a", "b"), stall_s: float = STALL_S) -> dict[str, Any]:
    """Compare two runs (e.g. colocated = a, disaggregated = b, over the same input): writes
    ``compare.json`` and ``compare.png`` into ``out_dir`` and returns the JSON's content:

    - ``labels``: [label a, label b];
    - ``a``, ``b``: each run's :func:`summarize_run` (plus ``label``);
    - ``side_by_side``: metric -> [a, b] for the headline metrics;
    - ``ratios_b_over_a``: b / a of ``output_tokens_per_s``, ``ttft_p99_s``, ``itl_p99_s``,
      ``itl_max_s`` and ``stalls`` (null where a's value is 0 or either is missing);
    - ``files``: name -> path.

    ``compare.png``: ITL CDFs of both runs on one log axis, TTFT CDFs, and bars of output
    tokens/s and stalls.

    Raises:
        FileNotFoundError, ValueError: see :func:`load_run`; ValueError for two equal labels.
    """
    labels = tuple(str(x) for x in labels)
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"compare needs two different labels, got {labels!r}")
    out = Path(out_dir)
    loaded = [load_run(Path(r)) for r in (run_a, run_b)]
    reports = [_summarize(Path(r), *ld, stall_s) for r, ld in zip((run_a, run_b), loaded)]
    for rep, lab in zip(reports, labels):
        rep["label"] = lab
    lats = [_latencies(ld[0]) for ld in loaded]
    out.mkdir(parents=True, exist_ok=True)
    png = out / "compare.png"
    _plot_compare(reports, lats, labels, png, stall_s)
    result = {
        "labels": list(labels),
        "stall_threshold_s": float(stall_s),
        "a": reports[0],
        "b": reports[1],
        "side_by_side": {k: [reports[0].get(k), reports[1].get(k)] for k in SIDE_BY_SIDE_KEYS},
        "ratios_b_over_a": {k: _ratio(reports[0].get(k), reports[1].get(k)) for k in RATIO_KEYS},
        "files": {"compare": str(out / "compare.json"), "compare_png": str(png)},
    }
    _write_json(out / "compare.json", result)
    return result


def _plot_compare(reports: list[dict], lats: list[dict], labels: Sequence[str], path: Path,
                  stall_s: float) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5), gridspec_kw={"width_ratios": [3, 3, 1.4, 1.4]})
    colors = ["#1f77b4", "#ff7f0e"]
    ax = axes[0]
    ax.set_xscale("log")
    for lat, lab, c, rep in zip(lats, labels, colors, reports):
        _ecdf(ax, _log_itl(lat["itl"]), f"{lab} (p99 {_ms(rep['itl_p99_s'])})", color=c)
    ax.axvline(stall_s, color=_COLORS["stall"], linewidth=1, label=f"stall {stall_s * 1e3:g} ms")
    ax.set(title="ITL CDF", xlabel="ITL (s, log)", ylabel="fraction of gaps", ylim=(0, 1.02))
    ax = axes[1]
    for lat, lab, c, rep in zip(lats, labels, colors, reports):
        _ecdf(ax, lat["ttft"], f"{lab} (p99 {_ms(rep['ttft_p99_s'])})", color=c)
    ax.set(title="TTFT CDF", xlabel="TTFT (s)", ylabel="fraction of requests", ylim=(0, 1.02))
    for ax, key, title in ((axes[2], "output_tokens_per_s", "output tokens/s"),
                           (axes[3], "stalls", f"stalls (> {stall_s * 1e3:g} ms)")):
        vals = [rep.get(key) or 0 for rep in reports]
        bars = ax.bar(list(labels), vals, color=colors)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in vals], fontsize=8)
        ax.set_title(title)
        ax.margins(y=0.15)
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- text and command line ------------------------------------------------------------------------

def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def summary_text(report: dict[str, Any]) -> str:
    """A few lines of text with the headline numbers of a report."""
    tps = report["output_tokens_per_s"]
    hit = report["prefix_cache_hit_rate"]
    lines = [
        f"{report['mode']} run: requests {report['requests']} (errors {report['errors']}) | "
        f"output tokens {report['output_tokens']} | wall {report['wall_s']:.2f} s | "
        f"{'-' if tps is None else f'{tps:.1f}'} output tok/s",
        f"TTFT p50 {_s(report['ttft_p50_s'])} p99 {_s(report['ttft_p99_s'])} | "
        f"ITL p50 {_ms(report['itl_p50_s'])} p99 {_ms(report['itl_p99_s'])} "
        f"max {_ms(report['itl_max_s'])}",
        f"stalls (> {report['stall_threshold_s'] * 1e3:g} ms) {report['stalls']} in "
        f"{report['requests_with_stalls']} requests | KV hand-off p50 {_ms(report['kv_handoff_p50_s'])} "
        f"p99 {_ms(report['kv_handoff_p99_s'])} | KV {report['kv_total_bytes'] / 2**20:.1f} MiB | "
        f"prefix cache hit {'-' if hit is None else f'{hit:.1%}'}",
    ]
    for name, w in report["workers"].items():
        busy = w["busy_fraction"]
        kv = w["max_kv_cache_usage"]
        mean = w["mean_batch_size"]
        lines.append(f"  {name} ({w['role']}): busy {'-' if busy is None else f'{busy:.0%}'}, "
                     f"batch mean {'-' if mean is None else f'{mean:.1f}'} max {w['max_batch_size']}, "
                     f"KV cache max {'-' if kv is None else f'{kv:.0%}'}")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report",
        description="Write a run's performance report (report.json and PNGs) from its metrics.")
    parser.add_argument("run_dir", help="the run directory")
    parser.add_argument("--compare", metavar="OTHER_RUN_DIR",
                        help="also compare with this run (RUN_DIR = a, OTHER_RUN_DIR = b)")
    parser.add_argument("--labels", nargs=2, metavar=("A", "B"),
                        help="names of the two runs in the comparison (default: their modes, "
                             "or their directory names)")
    parser.add_argument("--out", metavar="DIR", help="output directory (default RUN_DIR/report)")
    parser.add_argument("--stall-ms", type=float, default=STALL_S * 1e3,
                        help="stall threshold in milliseconds (default %(default)g)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if not args.stall_ms > 0:
        parser.error("--stall-ms must be > 0")
    stall_s = args.stall_ms / 1e3
    out = Path(args.out) if args.out else Path(args.run_dir) / "report"
    try:
        report = write_report(args.run_dir, out, stall_s)
        print(f"report: {out} (report.json, timeline.png, latency.png, utilisation.png)")
        print(summary_text(report))
        if args.compare:
            labels = args.labels
            if labels is None:
                other = summarize_run(args.compare, stall_s)
                labels = (report["mode"], other["mode"])
                if labels[0] == labels[1]:
                    labels = (Path(args.run_dir).resolve().name, Path(args.compare).resolve().name)
                if labels[0] == labels[1]:
                    labels = ("a", "b")
            cmp = compare_reports(args.run_dir, args.compare, out, labels, stall_s)
            print(f"compare: {cmp['files']['compare']}, {cmp['files']['compare_png']}")
            r = cmp["ratios_b_over_a"]

            def fmt(x):
                return "-" if x is None else f"{x:.2f}x"

            print(f"{labels[1]} / {labels[0]}: output tok/s {fmt(r['output_tokens_per_s'])}, "
                  f"TTFT p99 {fmt(r['ttft_p99_s'])}, ITL p99 {fmt(r['itl_p99_s'])}, "
                  f"ITL max {fmt(r['itl_max_s'])}, stalls {fmt(r['stalls'])}")
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
