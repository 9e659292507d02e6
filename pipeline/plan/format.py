"""The readable report ``python -m pipeline.plan`` prints without ``--json``."""

from __future__ import annotations

import math

from pipeline.plan.costs import kv_transfer_time, prefill_flops
from pipeline.plan.dram import DramTier
from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.recommend import Plan
from pipeline.plan.units import GB, GIB, secs
from pipeline.plan.workload import Workload


def format_plan(p: Plan) -> str:
    """A readable report of :class:`Plan` (what the command prints without ``--json``)."""
    m, hw, wl = p.model, p.hardware, p.workload
    d = p.disaggregated
    tp = p.colocated.prefill_tp
    link_tp = min(d.prefill_tp, d.decode_tp) if d is not None else tp
    per_worker = (f"{tp} per worker" if d is None or d.prefill_tp == d.decode_tp == tp else
                  f"{tp} per colocated worker, {d.prefill_tp} per prefill and {d.decode_tp} per decode worker")
    lines = [
        f"model      {m.name}: {m.layers} layers, {m.kv_heads} KV heads x {m.head_dim}, "
        f"{m.params:.3g} params, {m.dtype} ({m.weight_bytes / GB:.3g} GB of weights)",
        f"hardware   {hw.name}: {hw.peak_flops / 1e12:.4g} TFLOP/s x MFU {hw.mfu:g}, "
        f"{hw.mem_bw / GB:.4g} GB/s x MBU {hw.mbu:g}, "
        + (f"KV space {hw.kv_cache_bytes / GIB:.3g} GiB" if hw.kv_cache_bytes is not None
           else f"{hw.memory_bytes / GB:.4g} GB") + f", link {hw.link_bw / GB:.4g} GB/s"
        + (f" + {secs(hw.handoff_s)} per hand-off" if hw.handoff_s else "") + f"; {per_worker}",
        f"workload   {wl.source}: " + (f"{wl.rate:g} requests/s" if wl.rate is not None else f"batch of {wl.count}")
        + (f", {wl.count} requests" if wl.rate is not None and wl.count else "")
        + f"; prompt mean {wl.mean_prompt:.0f} tokens (p99 {wl.p99_prompt}), output mean {wl.mean_output:.0f}",
        f"KV cache   {m.kv_bytes_per_token / 1024:.4g} KiB/token (KV cache dtype {m.kv_cache_dtype}"
        + (f" = {m.kv_dtype}" if m.kv_cache_dtype != m.kv_dtype else "")
        + f", {_plural(m.kv_bytes_per_token // (2 * m.layers * m.kv_heads * m.head_dim), 'byte')} per element); "
        f"{p.colocated.kv_bytes / GIB:.3g} GiB per mean prompt; "
        f"{secs(kv_transfer_time(p.colocated.kv_bytes, hw, link_tp))} to move over {link_tp} x {hw.link_bw / GB:.3g} GB/s",
        f"prefill    {secs(p.colocated.prefill_s)} per mean prompt, {secs(p.colocated.prefill_p99_s)} for the p99 one "
        f"({prefill_flops(m, wl.mean_prompt):.3g} FLOPs)",
        "",
    ]
    cols = [("disaggregated", p.disaggregated), ("colocated", p.colocated)]
    cols = [(n, c) for n, c in cols if c is not None]
    head = [f"{n} {c.prefill_workers}P:{c.decode_workers}D" if c.decode_workers else f"{n} x{c.prefill_workers}"
            for n, c in cols]
    rows = [
        ("throughput (req/s)", lambda c: f"{c.throughput:.4g}"),
        ("output tokens/s", lambda c: f"{c.output_tokens_per_s:.4g}"),
        ("prefill utilisation", lambda c: f"{c.prefill_util:.2f}"),
        ("decode utilisation", lambda c: f"{c.decode_util:.2f}"),
        ("running per worker", lambda c: f"{c.running:.3g}"),
        ("queue wait", lambda c: secs(c.queue_wait_s)),
        ("TTFT mean", lambda c: secs(c.ttft_s)),
        *([("TTFT p50", lambda c: secs(c.ttft_p50_s))] if p.colocated.ttft_p50_s is not None else []),
        ("ITL mean", lambda c: secs(c.itl_s)),
        ("ITL worst", lambda c: secs(c.itl_worst_s)),
        ("gaps with a prefill", lambda c: f"{c.stall_fraction:.2%}" if c.mode == "colocated" else "-"),
        ("makespan", lambda c: secs(c.makespan_s) if c.makespan_s is not None else "-"),
    ]
    width = max(len(h) for h in head) + 2
    lines.append(f"{'':22}" + "".join(f"{h:>{width}}" for h in head))
    for label, fn in rows:
        lines.append(f"{label:22}" + "".join(f"{fn(c):>{width}}" for _, c in cols))
    lines += ["", f"target utilisation {p.target_util:g}, ITL target {secs(p.itl_target_s)}",
              f"recommendation: {p.recommendation} ({p.reason})"]
    lines += [f"cost: {c.option}: " + (f"{c.prefill_devices} prefill + {c.decode_devices} decode" if c.decode_devices
                                       else f"{c.prefill_devices}") + f" devices, {c.price_per_hour:.4g}/hour at "
              f"{c.output_tokens_per_s:.4g} output tokens/s = {c.per_million_output_tokens:.3g} per million output tokens"
              for c in p.costs]
    lines += [f"overrides: {p.overrides}"]
    lines += [f"note: {n}" for n in p.notes]
    if p.recommendation == "disaggregated":
        lines.append("note: a split is the plan's guess from prompts and max output lengths; with pools.elastic=true "
                     "the pipeline takes it as a starting point and rebalances at run time (decode ranks with room take "
                     "work units; prefill workers serve their rows themselves while they have places, or, with "
                     "pools.elastic_prefer=handoff, while every decode rank is full)")
    if p.colocated.rows_in_flight is not None and wl.rate is None:
        lines.append(f"note: {p.colocated.rows_in_flight} rows in flight per prefill or colocated worker "
                     f"(--batch-rows, the pipeline's job.batch_rows)")
    if p.dram is not None:
        lines += ["", format_dram(p.dram, m, hw, wl)]
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.4g} GiB" if math.isfinite(nbytes) else "unbounded"


def format_dram(d: DramTier, m: ModelShape, hw: Hardware, wl: Workload) -> str:
    """The DRAM-tier section of the report (``--dram-tier``; :func:`dram_tier`)."""
    batch = wl.rate is None
    on_node = min(d.decode_workers, d.workers_per_node)
    lines = [
        f"DRAM tier  decode host-DRAM KV pool for {d.prefill_workers}P:{d.decode_workers}D: {d.decode_workers} "
        f"decode worker{'s' if d.decode_workers > 1 else ''} of {d.tp} device{'s' if d.tp > 1 else ''}, {d.workers_per_node} per "
        f"{hw.node_devices}-device node, {d.decode_nodes} decode node{'s' if d.decode_nodes > 1 else ''}",
        f"  per request    {wl.mean_prompt + wl.mean_output:.0f} tokens (prompt {wl.mean_prompt:.0f} + output "
        f"{wl.mean_output:.0f}) x {m.kv_bytes_per_token / 1024:.4g} KiB = {_gib(d.request_bytes)}; "
        f"prompt KV {_gib(d.load_bytes)}",
        f"  slots          {d.slots} sequences at full length in {_gib(d.kv_capacity_bytes)} of KV cache "
        f"(max batch {hw.max_batch}); {d.admitted} at prompt length, so up to {d.swapped} preempted (reloaded from DRAM)",
        (f"  admission      {d.rate:.4g} req/s per worker while prefill runs x {secs(d.residence_s)} in a slot"
         if batch else f"  admission      {d.rate:.4g} req/s per worker x {secs(d.residence_s)} in a slot")
        + f" (load {secs(d.load_s)} + {wl.mean_output:.0f} x ITL {secs(d.itl_s)}): "
        + (f"would keep {d.offered:.3g} slots busy, has {d.slots}; fluid backlog, mean wait {secs(d.admit_wait_s)}"
           if batch else
           f"{d.offered:.3g} of {d.slots} slots busy; Erlang C wait {secs(d.admit_wait_s)} "
           f"(P(wait) {d.wait_probability:.3g})"),
        f"  held           a request's prompt KV, reserved before its prefill until its decode ends: "
        f"{secs(d.hold_s)} (prefill {secs(d.hold_s - d.transfer_s - d.admit_wait_s - d.residence_s)} with its "
        f"queue + push {secs(d.transfer_s)} + wait {secs(d.admit_wait_s)} + slot {secs(d.residence_s)})",
        (f"  in DRAM        peak {d.staged:.3g} requests = {_gib(d.staged * d.load_bytes)} per worker: the rows in "
         f"flight ({d.decoding:.3g} decoding + {d.waiting:.3g} waiting for a slot + {d.upstream:.3g} in prefill or "
         f"pushed)" if batch else
         f"  in DRAM        mean {d.upstream:.3g} in prefill or pushed + {d.waiting:.3g} waiting + {d.decoding:.3g} "
         f"decoding = {d.staged:.3g} requests = {_gib(d.staged * d.load_bytes)} per worker (Little's law)"),
    ]
    if d.sized_requests is not None:
        lines.append(f"  sized          ceil({d.headroom:g} x {d.staged:.3g}) = {d.sized_requests} "
                     f"request{'s' if d.sized_requests > 1 else ''} = "
                     f"{_gib(d.worker_bytes)} of prompt KV per worker; {_gib(d.node_bytes)} per decode node "
                     f"({on_node} worker{'s' if on_node > 1 else ''} on it)")
    else:
        lines.append("  sized          unbounded (see the note)")
    lines.append(f"  node DRAM      {_gib(d.node_dram_bytes)}"
                 f"{'' if hw.node_dram_bytes is not None else ' (/proc/meminfo)'}: "
                 + (f"fits, {d.node_bytes / d.node_dram_bytes:.1%} of it" if d.fits else "does NOT fit")
                 + (f"; a reservation finds the pool full {d.full_probability:.2%} of the time"
                    if d.full_probability is not None else ""))
    if d.sized_1pct is not None:
        lines.append(f"  for <= 1% full {d.sized_1pct} requests = {_gib(d.sized_1pct * d.load_bytes)} per worker, "
                     f"{_gib(on_node * d.sized_1pct * d.load_bytes)} per decode node "
                     f"({on_node * d.sized_1pct * d.load_bytes / d.node_dram_bytes:.1%} of its DRAM)")
    fits_gap = d.blocking_itl_s <= d.itl_target_s
    lines += [
        f"  DRAM->HBM load {_gib(d.load_bytes)} / ({d.tp} x {hw.h2d_bw / GB:.4g} GB/s) = {secs(d.load_s)} "
        f"= {d.load_steps:.3g} decode steps; not overlapped, one gap of {secs(d.blocking_itl_s)} "
        + (f"(within the {secs(d.itl_target_s)} ITL target)" if fits_gap else
           f"> the {secs(d.itl_target_s)} ITL target: overlap the load with decoding (layer by layer)"),
        f"  prefill hold   the prefill worker keeps a request's KV {secs(d.prefill_hold_s)} after its prefill "
        f"(the write into the tier; vLLM frees the blocks at the end of that engine step)",
        f"  TTFT           {secs(d.split_ttft_s)} + wait {secs(d.admit_wait_s)} + load "
        f"{secs(d.load_s)} = {secs(d.ttft_s)}; host link {d.h2d_util:.2%} busy with loads",
    ]
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)
