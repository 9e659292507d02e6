"""The numbers of ``report.json``: latency percentiles, stalls and worker utilisation of one run
(definitions in :mod:`pipeline.report`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.metrics import busy_seconds
from pipeline.report.check import check_against_output
from pipeline.report.load import Requests, load_run
from pipeline.roles.recompute import add_counts, kv_counts

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


def column(cols: Requests, name: str) -> np.ndarray:
    """A numeric column as float64 with NaN for nulls."""
    col = cols.table.column(name)
    if col.num_chunks == 0:
        return np.zeros(0)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def first_last(cols: Requests) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first and last token time (NaN for a request without tokens)."""
    return cols.first, cols.last


def itl_gaps(cols: Requests) -> np.ndarray:
    """Every request's gaps between consecutive token times, pooled (none across two requests):
    the run's own array, in no particular order; a reader may reorder it in place (sort,
    partition), never change its values."""
    return cols.gaps


def run_start(cols: Requests, workers: Any = None) -> float:
    """Epoch seconds of the run start: the earliest ``read_at`` (else prefill_start, first token,
    first worker step)."""
    for name in ("read_at", "prefill_start"):
        v = column(cols, name)
        if np.isfinite(v).any():
            return float(np.nanmin(v))
    first, _ = first_last(cols)
    if np.isfinite(first).any():
        return float(np.nanmin(first))
    if workers is not None and workers.num_rows:
        t = np.asarray(workers.column("t").to_numpy(zero_copy_only=False), dtype=np.float64)
        return float(np.nanmin(t))
    return 0.0


def latencies(cols: Requests) -> dict[str, np.ndarray]:
    """The raw values behind the statistics (definitions in :mod:`pipeline.report`): ``ttft``,
    ``itl`` (pooled), ``handoff``, ``queue`` and ``prefill``."""
    first, _ = first_last(cols)
    ps, pe, ra = column(cols, "prefill_start"), column(cols, "prefill_end"), column(cols, "read_at")

    def ok(a: np.ndarray) -> np.ndarray:
        return a[np.isfinite(a)]

    return {
        "ttft": ok(first - ps),
        "itl": itl_gaps(cols),
        "handoff": ok(first - pe),
        "queue": ok(ps - ra),
        "prefill": ok(pe - ps),
    }


def stalls(cols: Requests, stall_s: float) -> tuple[int, int]:
    """(ITL gaps longer than ``stall_s``, requests with at least one)."""
    return int(np.count_nonzero(cols.gaps > stall_s)), int(np.count_nonzero(cols.max_gap > stall_s))


def _numbers(table: Any, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _distinct(col: Any) -> list[Any]:
    """A column's distinct values (null: None), in order of first appearance."""
    u = col.unique()
    return (u.cast(u.type.value_type) if pa.types.is_dictionary(u.type) else u).to_pylist()


class WorkerSteps:
    """A worker step table (pyarrow) by worker and role: ``keys``, its (worker, role) pairs (null:
    None), and :meth:`rows`, the step rows of one worker (or of one pair), filtered out of the
    table one at a time (issue #39: 2 million steps are never copied whole into numpy)."""

    def __init__(self, workers: Any):
        self.table = workers
        self.keys: list[tuple[Any, Any]] = []
        if workers is None or workers.num_rows == 0:
            return
        for w in _distinct(workers.column("worker")):
            self.keys += [(w, r) for r in _distinct(self.rows(w).column("role"))]

    @staticmethod
    def _is(col: Any, value: Any) -> Any:
        """Whether each of ``col``'s values is ``value``; a dictionary column's by its indices
        (its strings never decoded)."""
        if value is None:
            return pc.is_null(col)
        if not pa.types.is_dictionary(col.type):
            return pc.fill_null(pc.equal(col, value), False)
        return pa.chunked_array([pc.fill_null(pc.equal(c.indices, pc.index(c.dictionary, value)), False)
                                 for c in col.chunks], pa.bool_())

    def rows(self, worker: Any, role: Any = ...) -> Any:
        """The step rows of ``worker`` (of ``role`` too, unless left out), in table order."""
        mine = self._is(self.table.column("worker"), worker)
        if role is not ...:
            mine = pc.and_(mine, self._is(self.table.column("role"), role))
        return self.table.filter(mine)


def worker_stats(workers: Any) -> dict[str, dict[str, Any]]:
    """Per worker id: ``role``, ``steps``, ``span_s`` (first to last step), ``busy_s``,
    ``busy_fraction`` (see :mod:`pipeline.report`; null for a span of 0), ``mean_batch_size``
    (over steps with running > 0), ``max_batch_size``, ``max_kv_cache_usage`` (0..1),
    ``prefix_cache_queries`` / ``prefix_cache_hits`` (prompt tokens, vLLM's local prefix cache)
    and their ratio ``prefix_cache_hit_rate`` (null without queries). A worker at a time
    (:class:`WorkerSteps`)."""
    out: dict[str, dict[str, Any]] = {}
    steps = WorkerSteps(workers)
    roles_of: dict[Any, set] = {}
    for w, r in steps.keys:
        roles_of.setdefault(w, set()).add(r)
    names = workers.column_names if steps.keys else []
    for w in sorted(roles_of, key=str):
        mine = steps.rows(w)
        t = _numbers(mine, "t")
        order = np.argsort(t, kind="stable")
        t = t[order]
        running = _numbers(mine, "running")[order]
        kv = _numbers(mine, "kv_cache_usage")[order]
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
        roles = roles_of[w]
        queries = int(np.nan_to_num(_numbers(mine, "prefix_cache_queries")).sum()) if "prefix_cache_queries" in names else 0
        hits = int(np.nan_to_num(_numbers(mine, "prefix_cache_hits")).sum()) if "prefix_cache_hits" in names else 0
        out[str(w)] = {
            "role": sorted(r for r in roles if r is not None)[0] if roles - {None} else None,
            "steps": int(mine.num_rows),
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


def _prefill_busy(ws: dict[str, dict[str, Any]], cols: Requests) -> None:
    """A prefill worker's busy time is also the union of its rows' prefills (``prefill_start``
    to ``prefill_end``, within its span): a prefill usually starts and ends inside one engine
    step, so no step's ``running`` sees it. The larger of the two counts."""
    todo = [w for w, st in ws.items() if st["role"] == "prefill" and st["span_s"]]
    if not todo:
        return
    ps, pe = column(cols, "prefill_start"), column(cols, "prefill_end")
    pw = cols.table.column("prefill_worker").cast(pa.string())
    for w in todo:
        st = ws[w]
        mine = np.asarray(pc.fill_null(pc.equal(pw, w), False).to_numpy(zero_copy_only=False), dtype=bool)
        mine &= np.isfinite(ps) & np.isfinite(pe)
        busy = busy_seconds(list(zip(ps[mine].tolist(), pe[mine].tolist())))
        if busy > st["busy_s"]:
            st["busy_s"] = min(busy, st["span_s"])
            st["busy_fraction"] = st["busy_s"] / st["span_s"]


def _sum_int(cols: Requests, name: str) -> int:
    return int(pc.sum(cols.table.column(name)).as_py() or 0)


def _decode_kv(cols: Requests) -> dict[str, int]:
    """:func:`kv_counts` over every request, a record batch at a time."""
    t = cols.table.select(["decode_worker", "error", "prompt_tokens", "kv_tokens", "prefill_end"])
    total = add_counts(None, None)
    for batch in t.to_batches(max_chunksize=65536):
        c = batch.to_pydict()
        total = add_counts(total, kv_counts(zip(c["decode_worker"], c["error"], c["prompt_tokens"], c["kv_tokens"],
                                                (v is not None for v in c["prefill_end"]))))
    return total


def summarize(run: Path, cols: Requests, workers: Any, run_summary: dict | None,
              stall_s: float) -> dict[str, Any]:
    """:func:`summarize_run` of a run already read by :func:`pipeline.report.load.load_run`."""
    n = len(cols)
    start = run_start(cols, workers)
    _, last = first_last(cols)
    wall = float(np.nanmax(last) - start) if np.isfinite(last).any() else 0.0
    output_tokens = _sum_int(cols, "output_tokens")
    prompt_tokens = _sum_int(cols, "prompt_tokens")
    cached = _sum_int(cols, "prefix_cached_tokens")
    n_stalls, stalled = stalls(cols, stall_s)
    disagg = cols.table.column("decode_worker").null_count < n or cols.table.column("prefill_end").null_count < n
    ws = worker_stats(workers)
    _prefill_busy(ws, cols)
    # Over every worker's steps with running > 0: integers, so their sum is exact and the mean
    # is the one numpy gives (not a float64 copy of 2 million steps).
    running = workers.column("running") if workers is not None and workers.num_rows else pa.chunked_array([], pa.int32())
    active = pc.filter(running, pc.greater(running, 0))
    active_sum = pc.sum(active).as_py() or 0
    kv_max = [w["max_kv_cache_usage"] for w in ws.values() if w["max_kv_cache_usage"] is not None]
    batch_max = [w["max_batch_size"] for w in ws.values() if w["max_batch_size"] is not None]

    out: dict[str, Any] = {
        "run_dir": str(run),
        "mode": "disaggregated" if disagg else "colocated",
        "stall_threshold_s": float(stall_s),
        "percentile_method": f"numpy.percentile(method={PERCENTILE_METHOD!r})",
        "requests": n,
        "errors": n - cols.table.column("error").null_count,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "wall_s": wall,
        "output_tokens_per_s": output_tokens / wall if wall > 0 else None,
        "checked_against_output": check_against_output(run, cols),
    }
    lat = latencies(cols)
    itl = lat.pop("itl")
    gaps, zeros, itl_max = int(itl.size), int(np.count_nonzero(itl == 0)), _max(itl)
    # The percentiles in one call, in the gaps' own memory (10^6 requests of 32 tokens: 250 MB),
    # as numpy.percentile of them would give them.
    itl_ps = (np.percentile(itl, (50, 90, 99), method=PERCENTILE_METHOD, overwrite_input=True).tolist()
              if itl.size else [None] * 3)
    del itl
    for q in (50, 90, 99):
        out[f"ttft_p{q}_s"] = percentile(lat["ttft"], q)
    out["ttft_max_s"] = _max(lat["ttft"])
    for q, v in zip((50, 90, 99), itl_ps):
        out[f"itl_p{q}_s"] = json_float(v)
    out["itl_max_s"] = itl_max
    out["itl_gaps"] = gaps
    out["itl_zero_gaps"] = zeros
    for name, key in (("handoff", "kv_handoff"), ("queue", "queue_wait"), ("prefill", "prefill")):
        for q in (50, 99):
            out[f"{key}_p{q}_s"] = percentile(lat[name], q)
    out.update({
        "kv_total_bytes": _sum_int(cols, "kv_bytes"),
        "kv_tokens": _sum_int(cols, "kv_tokens"),
        "decode_kv": _decode_kv(cols),
        "stalls": n_stalls,
        "requests_with_stalls": stalled,
        # The run's median ITL above the threshold: most steps are "stalls", the count says
        # nothing (pipeline.report.text.stalls_text says so instead of printing it).
        "itl_p50_above_stall_threshold": bool(out["itl_p50_s"] is not None and out["itl_p50_s"] > stall_s),
        "prefix_cached_tokens": cached,
        "prefix_cache_hit_rate": cached / prompt_tokens if prompt_tokens else None,
        "workers": ws,
        "busy_fraction": {w: s["busy_fraction"] for w, s in ws.items()},
        "mean_batch_size": json_float(active_sum / len(active)) if len(active) else None,
        "max_batch_size": max(batch_max) if batch_max else None,
        "max_kv_cache_usage": max(kv_max) if kv_max else None,
        "run_summary": run_summary,
    })
    return out
