"""Per-run figures of ``tools/bench.py`` beyond :func:`pipeline.report.summary.summarize_run`,
from a run's request and worker metrics columns (``RUN_DIR/metrics``): stalls by what
overlapped them, hand-off parts, throughput per shard owner, engine steps."""

from __future__ import annotations

import statistics
from typing import Any

from tools.benchlib.stats import percentile


def stall_attribution(cols: dict[str, list], stall_s: float) -> dict[str, Any]:
    """Each ITL gap > ``stall_s`` of a request, attributed to what overlapped it (see the module
    docstring of tools/bench.py): counts and the longest gap per cause."""
    n = len(cols["key"])
    engine = [cols["decode_worker"][i] or cols["prefill_worker"][i] for i in range(n)]
    first = [tt[0] if tt else None for tt in cols["token_times"]]
    local = []   # (engine, start, end, request index): prefill work on the engine that decodes
    remote = []  # (start, end, request index): prefill on a separate prefill worker
    for i in range(n):
        if first[i] is None:
            continue
        if cols["decode_worker"][i] is not None:
            if cols["decode_arrived_at"][i] is not None:
                local.append((engine[i], cols["decode_arrived_at"][i], first[i], i))
            if cols["prefill_start"][i] is not None and cols["prefill_end"][i] is not None:
                remote.append((cols["prefill_start"][i], cols["prefill_end"][i], i))
        elif cols["prefill_start"][i] is not None:
            local.append((engine[i], cols["prefill_start"][i], first[i], i))
    causes = {"prefill": [], "remote prefill": [], "none": []}
    for i, tt in enumerate(cols["token_times"]):
        for a, b in zip(tt or [], (tt or [])[1:]):
            if b - a <= stall_s:
                continue
            if any(e == engine[i] and j != i and s < b and f > a for e, s, f, j in local):
                causes["prefill"].append(b - a)
            elif any(j != i and s < b and f > a for s, f, j in remote):
                causes["remote prefill"].append(b - a)
            else:
                causes["none"].append(b - a)
    return {k: {"count": len(v), "max_s": max(v) if v else None} for k, v in causes.items()}


def handoff_parts(cols: dict[str, list], steps: dict[str, list] | None = None) -> dict[str, Any] | None:
    """Per disaggregated request: ``message`` = decode_arrived_at - prefill_end, ``transfer`` =
    token_times[0] - decode_arrived_at (KV transfer + decode scheduling + the 1-token step),
    ``total`` = their sum; p50/p99/max of each, and the first-arrived request's extra over the
    median (the one-time NIXL handshake estimate). With ``steps`` (the run's worker metrics
    columns), also NIXL's own telemetry of each KV transfer (``nixl_*``: seconds from post to
    completion, seconds to post, bytes, GB/s of each transfer; p50 over transfers)."""
    rows = []
    for pe, da, tt in zip(cols["prefill_end"], cols["decode_arrived_at"], cols["token_times"]):
        if pe is not None and da is not None and tt:
            rows.append((da, da - pe, tt[0] - da, tt[0] - pe))
    if not rows:
        return None
    rows.sort()
    out: dict[str, Any] = {"requests": len(rows)}
    for k, idx in (("message", 1), ("transfer", 2), ("total", 3)):
        vals = [r[idx] for r in rows]
        out[f"{k}_p50_s"] = percentile(vals, 50)
        out[f"{k}_p99_s"] = percentile(vals, 99)
        out[f"{k}_max_s"] = max(vals)
        out[f"{k}_first_s"] = rows[0][idx]
        out[f"{k}_first_extra_s"] = rows[0][idx] - statistics.median(vals)
    if steps is not None:
        xs = [(t, p, b) for ts, ps, bs in zip(steps["kv_transfer_s"], steps["kv_post_s"], steps["kv_transfer_bytes"])
              if ts for t, p, b in zip(ts, ps, bs)]
        if xs:
            out["nixl_transfers"] = len(xs)
            out["nixl_bytes_total"] = sum(x[2] for x in xs)
            out["nixl_transfer_p50_s"] = percentile([x[0] for x in xs], 50)
            out["nixl_post_p50_s"] = percentile([x[1] for x in xs], 50)
            out["nixl_bytes_p50"] = percentile([x[2] for x in xs], 50)
            out["nixl_gbps_p50"] = percentile([x[2] / x[0] / 1e9 for x in xs if x[0] > 0], 50)
    return out


def per_owner_throughput(cols: dict[str, list]) -> dict[str, Any]:
    """Throughput with each shard owner's own engine start-up removed: the sum over owners
    (prefill or colocated workers) of its rows' output tokens / (its last token - its first
    ``read_at``). Equal to summarize_run's figure with one owner; with several colocated workers
    it drops the time one worker served alone while the other's engine was still starting.
    ``owner_start_skew_s``: latest minus earliest owner's first ``read_at``."""
    by: dict[str, list[int]] = {}
    for i, w in enumerate(cols["prefill_worker"]):
        by.setdefault(w, []).append(i)
    rate, starts = 0.0, []
    for idx in by.values():
        t0 = min(cols["read_at"][i] for i in idx)
        t1 = max(cols["token_times"][i][-1] for i in idx if cols["token_times"][i])
        rate += sum(cols["output_tokens"][i] or 0 for i in idx) / max(t1 - t0, 1e-9)
        starts.append(t0)
    return {"output_tokens_per_s_per_owner_sum": rate, "owner_start_skew_s": max(starts) - min(starts)}


def worker_steps(w: dict[str, list], t0: float, t1: float) -> dict[str, Any]:
    """Per worker: engine steps recorded, steps that computed no token, steps per second of the
    window, and ``token_step_p50_s``: the median time from one step that computed tokens to the
    next step (its own duration; the metrics record each step's end), from the run's worker
    metrics columns (RUN_DIR/metrics/workers)."""
    out: dict[str, dict[str, Any]] = {}
    ends: dict[str, list[tuple[float, bool]]] = {}
    for i, name in enumerate(w["worker"]):
        d = out.setdefault(name.split("@")[0], {"steps": 0, "idle_steps": 0, "steps_in_window": 0})
        d["steps"] += 1
        work = bool(w["prompt_tokens"][i] or w["generation_tokens"][i])
        if not work:
            d["idle_steps"] += 1
        if t0 <= w["t"][i] <= t1:
            d["steps_in_window"] += 1
        ends.setdefault(name.split("@")[0], []).append((w["t"][i], work))
    for name, d in out.items():
        d["steps_per_s"] = d["steps_in_window"] / max(t1 - t0, 1e-9)
        e = sorted(ends[name])
        gaps = [b[0] - a[0] for a, b in zip(e, e[1:]) if b[1]]
        d["token_step_p50_s"] = statistics.median(gaps) if gaps else None
    return out
