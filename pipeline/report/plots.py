"""The report's PNGs (matplotlib, Agg backend): the token timeline, the latency distributions,
worker utilisation, and the comparison of two runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.report.summary import WorkerSteps, _numbers, column, percentile
from pipeline.report.text import ms

TIMELINE_MAX_ROWS = 500
"""Above this many requests the timeline draws an evenly spaced subset of this many rows."""

ZERO_GAP_PLOT_S = 1e-5
"""Where log-scale ITL plots draw gaps of 0 s (tokens that arrived together)."""

ECDF_MAX_POINTS = 20000
"""An empirical CDF of more values is drawn through this many of them, evenly spaced in rank
(the first and the last always), which a plot cannot tell from all of them."""

_COLORS = {"queue": "#cccccc", "prefill": "#1f77b4", "handoff": "#ff7f0e", "token": "#333333",
           "stall": "#d62728"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _ecdf(ax, values: np.ndarray, label: str, presorted: bool = False, floor: float | None = None, **kw) -> None:
    """The empirical CDF of ``values`` (``presorted``: already in order), through at most
    :data:`ECDF_MAX_POINTS` of them; ``floor``: values below it drawn at it (a log axis)."""
    v = values if presorted else np.sort(values)
    if v.size == 0:
        return
    rank = (np.unique(np.linspace(1, v.size, ECDF_MAX_POINTS).round().astype(np.int64))
            if v.size > ECDF_MAX_POINTS else np.arange(1, v.size + 1))  # never a rank per value
    x = v[rank - 1]
    ax.step(x if floor is None else np.maximum(x, floor), rank / v.size, where="post", label=label, **kw)


def _mark(ax, values: np.ndarray, unit_scale: float = 1.0, unit: str = "s",
          marks: dict[int, float | None] | None = None) -> None:
    for q, style in ((50, "--"), (99, ":")):
        p = percentile(values, q) if marks is None else marks[q]
        if p is not None:
            ax.axvline(max(p, ZERO_GAP_PLOT_S) if ax.get_xscale() == "log" else p, color="k",
                       linestyle=style, linewidth=1,
                       label=f"p{q} = {p * unit_scale:.3g} {unit}")


def _row_order(cols: dict[str, list]) -> np.ndarray:
    ps = column(cols, "prefill_start")
    fallback = column(cols, "read_at")
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
    tts = cols.token_times_of(order)
    ra, ps, pe = column(cols, "read_at"), column(cols, "prefill_start"), column(cols, "prefill_end")

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


def plot_latency(lat: dict[str, np.ndarray], path: Path, stall_s: float) -> None:
    """TTFT (linear) and ITL (log x) histograms and CDFs, p50/p99 marked."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ttft, itl = lat["ttft"], lat["itl"]
    # ITL: its marks, then sorted, in its own memory (the run's gaps, reordered in place: 10^6
    # requests of 32 tokens hold 250 MB of them), its zeros counted there; drawn through
    # ECDF_MAX_POINTS, counted into 60 bins.
    itl_marks = dict(zip((50, 99), np.percentile(itl, (50, 99), overwrite_input=True).tolist())) \
        if itl.size else {50: None, 99: None}
    itl.sort()  # after the marks: their partition may reorder it
    zeros = int(np.searchsorted(itl, 0.0, side="right") - np.searchsorted(itl, 0.0, side="left"))
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
        lo, hi = max(itl[0], ZERO_GAP_PLOT_S), max(itl[-1], ZERO_GAP_PLOT_S)
        bins = np.logspace(np.log10(lo), np.log10(hi * 1.0001 if hi > lo else lo * 10), 60)
        below = int(np.searchsorted(itl, ZERO_GAP_PLOT_S))  # drawn at ZERO_GAP_PLOT_S: the first bin
        counts = np.histogram(itl[below:], bins=bins)[0]
        counts[0] += below
        ax.hist(bins[:-1], bins=bins, weights=counts, color=_COLORS["handoff"], alpha=0.8)
    _mark(ax, itl, 1e3, "ms", itl_marks)
    ax.axvline(stall_s, color=_COLORS["stall"], linewidth=1, label=f"stall threshold {stall_s * 1e3:g} ms")
    ax.set(title=f"ITL histogram ({itl.size} gaps{zero_note})", xlabel="ITL (s, log)", ylabel="gaps")
    ax = axes[1, 1]
    ax.set_xscale("log")
    _ecdf(ax, itl, "ITL", presorted=True, floor=ZERO_GAP_PLOT_S, color=_COLORS["handoff"])
    _mark(ax, itl, 1e3, "ms", itl_marks)
    ax.axvline(stall_s, color=_COLORS["stall"], linewidth=1, label=f"stall threshold {stall_s * 1e3:g} ms")
    ax.set(title="ITL CDF", xlabel="ITL (s, log)", ylabel="fraction of gaps", ylim=(0, 1.02))
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


UTILISATION_MAX_POINTS = 4000
"""A worker with more steps is drawn through this many equal spans of its time, each at the most
of its steps there (the peaks stay; a 12-inch plot cannot show more)."""


def _envelope(t: np.ndarray, *series: np.ndarray) -> tuple[np.ndarray, ...]:
    """``t`` (sorted) cut into :data:`UTILISATION_MAX_POINTS` equal spans: each non-empty span's
    first time, and each series' largest value in it (NaN where all are NaN)."""
    edges = np.linspace(t[0], t[-1], UTILISATION_MAX_POINTS + 1)
    starts = np.unique(np.searchsorted(t, edges[:-1], side="left"))
    starts = starts[starts < t.size]
    out = [t[starts]]
    for s in series:
        filled = np.where(np.isnan(s), -np.inf, s)
        m = np.maximum.reduceat(filled, starts)
        out.append(np.where(np.isneginf(m), np.nan, m))
    return tuple(out)


def plot_utilisation(workers: Any, path: Path, start: float) -> None:
    """One panel per role: running batch size per worker (solid, left axis) and KV cache usage
    (dashed, right axis, %), over seconds since run start."""
    plt = _plt()
    steps = WorkerSteps(workers)
    roles = sorted({r for _, r in steps.keys if r is not None}, key=lambda r: (
        ["prefill", "decode", "colocated"].index(r) if r in ("prefill", "decode", "colocated") else 9, r))
    fig, axes = plt.subplots(max(1, len(roles)), 1, figsize=(12, 3.2 * max(1, len(roles))),
                             squeeze=False, sharex=True)
    if not roles:
        ax = axes[0, 0]
        ax.text(0.5, 0.5, "no worker metrics in this run", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
    cmap = plt.get_cmap("tab10")
    for ax, role in zip(axes[:, 0], roles):
        thinned = False
        ax2 = ax.twinx()
        names = sorted(w for (w, r) in steps.keys if r == role)
        top = 1.0  # the panel's largest batch size, at least 1
        for k, name in enumerate(names):
            mine = steps.rows(name, role)  # a worker's steps at a time
            t = _numbers(mine, "t")
            o = np.argsort(t, kind="stable")
            t = t[o] - start
            run = _numbers(mine, "running")[o]
            kv = _numbers(mine, "kv_cache_usage")[o]
            if np.isfinite(run).any():
                top = max(top, float(np.nanmax(run)))
            if t.size > UTILISATION_MAX_POINTS:
                t, run, kv = _envelope(t, run, kv)
                thinned = True
            color = cmap(k % 10)
            ax.step(t, run, where="post", color=color, linewidth=1, label=f"{name} running")
            ax2.step(t, kv * 100, where="post", color=color, linewidth=1, linestyle="--", alpha=0.7,
                     label=f"{name} KV cache")
        ax.set_ylabel("running requests")
        ax.set_ylim(0, top * 1.1)
        ax2.set_ylabel("KV cache usage (%)")
        ax2.set_ylim(0, 110)
        ax.set_title(f"{role} workers: batch size (solid) and KV cache usage (dashed)"
                     + (f"; each the most of its steps in {UTILISATION_MAX_POINTS} spans" if thinned else ""))
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


def plot_compare(reports: list[dict], lats: list[dict], labels: Sequence[str], path: Path,
                 stall_s: float) -> None:
    """``compare.png``: ITL CDFs of both runs on one log axis, TTFT CDFs, and bars of output
    tokens/s and stalls (``lats``: each run's :func:`pipeline.report.summary.latencies`)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5), gridspec_kw={"width_ratios": [3, 3, 1.4, 1.4]})
    colors = ["#1f77b4", "#ff7f0e"]
    ax = axes[0]
    ax.set_xscale("log")
    for lat, lab, c, rep in zip(lats, labels, colors, reports):
        _ecdf(ax, lat["itl"], f"{lab} (p99 {ms(rep['itl_p99_s'])})", floor=ZERO_GAP_PLOT_S, color=c)
    ax.axvline(stall_s, color=_COLORS["stall"], linewidth=1, label=f"stall {stall_s * 1e3:g} ms")
    ax.set(title="ITL CDF", xlabel="ITL (s, log)", ylabel="fraction of gaps", ylim=(0, 1.02))
    ax = axes[1]
    for lat, lab, c, rep in zip(lats, labels, colors, reports):
        _ecdf(ax, lat["ttft"], f"{lab} (p99 {ms(rep['ttft_p99_s'])})", color=c)
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
