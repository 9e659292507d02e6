"""The numbers of ``report.json``: latency percentiles, stalls and worker utilisation of one run
(definitions in :mod:`pipeline.report`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io.metrics import busy_seconds
from pipeline.report.check import check_against_output
from pipeline.report.load import load_run
from pipeline.roles.recompute import kv_counts

STALL_S = 0.060
"""Default stall threshold: an ITL gap longer than this (seconds) is a stall."""

PERCENTILE_METHOD = "linear"


def json_float(x: Any) -> float | None:
    """A JSON-safe float (None for None / NaN / inf)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def percentile(values: np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile (:data:`PERCENTILE_METHOD`) as a JSON-safe float; None for no
    values."""
    if values.size == 0:
        return None
    return json_float(np.percentile(values, q, method=PERCENTILE_METHOD))


def _max(values: np.ndarray) -> float | None:
    return json_float(values.max()) if values.size else None


def column(cols: dict[str, list], name: str) -> np.ndarray:
    """A numeric column as float64 with NaN for nulls."""
    return np.array([np.nan if v is None else v for v in cols[name]], dtype=np.float64)


def token_times(cols: dict[str, list]) -> list[np.ndarray]:
    """Each request's ``token_times`` as a float64 array (empty for null)."""
    return [np.asarray(tt if tt is not None else [], dtype=np.float64) for tt in cols["token_times"]]


def run_start(cols: dict[str, list], workers: Any = None) -> float:
    """Epoch seconds of the run start: the earliest ``read_at`` (else prefill_start, first token,
    first worker step)."""
    for name in ("read_at", "prefill_start"):
        v = column(cols, name)
        if np.isfinite(v).any():
            return float(np.nanmin(v))
    firsts = [tt[0] for tt in token_times(cols) if tt.size]
    if firsts:
        return float(min(firsts))
    if workers is not None and workers.num_rows:
        return float(min(t for t in workers.column("t").to_pylist() if t is not None))
    return 0.0


def latencies(cols: dict[str, list]) -> dict[str, np.ndarray]:
    """The raw values behind the statistics (definitions in :mod:`pipeline.report`): ``ttft``,
    ``itl`` (pooled), ``itl_per_request`` (a list), ``handoff``, ``queue`` and ``prefill``."""
    tts = token_times(cols)
    first = np.array([tt[0] if tt.size else np.nan for tt in tts])
    ps, pe, ra = column(cols, "prefill_start"), column(cols, "prefill_end"), column(cols, "read_at")

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
    ``busy_fraction`` (see :mod:`pipeline.report`; null for a span of 0), ``mean_batch_size``
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
            "mean_batch_size": json_float(active.mean()) if active.size else None,
            "max_batch_size": int(np.nanmax(running)) if np.isfinite(running).any() else None,
            "max_kv_cache_usage": json_float(np.nanmax(kv)) if np.isfinite(kv).any() else None,
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
    - ``decode_kv``: whether the KV moved (:func:`pipeline.roles.recompute.kv_counts`, a request
      handed off with its KV when its ``prefill_end`` is not null): ``rows`` handed off with
      their KV, ``kv_loaded_rows`` (decode computed at most their last prompt token),
      ``recomputed_rows`` (decode recomputed the prompt: the KV did not arrive),
      ``prompt_tokens``, ``computed_tokens`` and ``recomputed_tokens`` (prompt tokens decode
      computed, over all and over recomputed rows), ``local_rows`` / ``local_tokens`` (prefilled
      on decode on purpose, ``pools.local_prefill_tokens``);
    - ``stalls`` (ITL gaps > stall_threshold_s), ``requests_with_stalls``;
    - ``prefix_cached_tokens``, ``prefix_cache_hit_rate`` = prefix_cached_tokens / prompt_tokens;
    - ``workers``: :func:`worker_stats` per worker id; ``busy_fraction`` (worker id -> fraction),
      ``mean_batch_size`` (over every worker's steps with running > 0), ``max_batch_size``,
      ``max_kv_cache_usage`` (0..1, over all workers);
    - ``checked_against_output``: the served rows' count and tokens against the output shards of
      every shard done (:func:`pipeline.report.check.check_against_output`: ``shards``,
      ``mismatches``);
    - ``run_summary``: the launcher's ``summary.json`` (null when absent).

    Raises:
        FileNotFoundError, ValueError: see :func:`pipeline.report.load.load_run`.
    """
    cols, workers, run_summary = load_run(run_path)
    return summarize(Path(run_path), cols, workers, run_summary, stall_s)


def _prefill_busy(ws: dict[str, dict[str, Any]], cols: dict[str, list]) -> None:
    """A prefill worker's busy time is also the union of its rows' prefills (``prefill_start``
    to ``prefill_end``, within its span): a prefill usually starts and ends inside one engine
    step, so no step's ``running`` sees it. The larger of the two counts."""
    for w, st in ws.items():
        if st["role"] != "prefill" or not st["span_s"]:
            continue
        t = [(a, b) for a, b, pw in zip(cols["prefill_start"], cols["prefill_end"], cols["prefill_worker"])
             if pw == w and a is not None and b is not None]
        busy = busy_seconds(t)
        if busy > st["busy_s"]:
            st["busy_s"] = min(busy, st["span_s"])
            st["busy_fraction"] = st["busy_s"] / st["span_s"]


def _sum_int(cols: dict[str, list], name: str) -> int:
    return int(sum(v for v in cols[name] if v is not None))


def summarize(run: Path, cols: dict[str, list], workers: Any, run_summary: dict | None,
              stall_s: float) -> dict[str, Any]:
    """:func:`summarize_run` of a run already read by :func:`pipeline.report.load.load_run`."""
    lat = latencies(cols)
    n = len(cols["key"])
    start = run_start(cols, workers)
    lasts = [tt[-1] for tt in token_times(cols) if tt.size]
    wall = float(max(lasts) - start) if lasts else 0.0
    output_tokens = _sum_int(cols, "output_tokens")
    prompt_tokens = _sum_int(cols, "prompt_tokens")
    cached = _sum_int(cols, "prefix_cached_tokens")
    itl = lat["itl"]
    stall_counts = [int((g > stall_s).sum()) for g in lat["itl_per_request"]]
    disagg = any(v is not None for v in cols["decode_worker"]) or \
        any(v is not None for v in cols["prefill_end"])
    ws = worker_stats(workers)
    _prefill_busy(ws, cols)
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
        "checked_against_output": check_against_output(run, cols),
    }
    for name, key in (("ttft", "ttft"), ("itl", "itl")):
        for q in (50, 90, 99):
            out[f"{key}_p{q}_s"] = percentile(lat[name], q)
        out[f"{key}_max_s"] = _max(lat[name])
    out["itl_gaps"] = int(itl.size)
    out["itl_zero_gaps"] = int((itl == 0).sum())
    for name, key in (("handoff", "kv_handoff"), ("queue", "queue_wait"), ("prefill", "prefill")):
        for q in (50, 99):
            out[f"{key}_p{q}_s"] = percentile(lat[name], q)
    out.update({
        "kv_total_bytes": _sum_int(cols, "kv_bytes"),
        "kv_tokens": _sum_int(cols, "kv_tokens"),
        "decode_kv": kv_counts(zip(cols["decode_worker"], cols["error"], cols["prompt_tokens"], cols["kv_tokens"],
                                   (v is not None for v in cols["prefill_end"]))),
        "stalls": int(sum(stall_counts)),
        "requests_with_stalls": int(sum(1 for c in stall_counts if c)),
        # The run's median ITL above the threshold: most steps are "stalls", the count says
        # nothing (pipeline.report.text.stalls_text says so instead of printing it).
        "itl_p50_above_stall_threshold": bool(out["itl_p50_s"] is not None and out["itl_p50_s"] > stall_s),
        "prefix_cached_tokens": cached,
        "prefix_cache_hit_rate": cached / prompt_tokens if prompt_tokens else None,
        "workers": ws,
        "busy_fraction": {w: s["busy_fraction"] for w, s in ws.items()},
        "mean_batch_size": json_float(running_all.mean()) if running_all.size else None,
        "max_batch_size": max(batch_max) if batch_max else None,
        "max_kv_cache_usage": max(kv_max) if kv_max else None,
        "run_summary": run_summary,
    })
    return out
