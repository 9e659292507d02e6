"""The Markdown tables of ``tools/bench.py``: medians over repeats per configuration, ratios of
medians (see its module docstring for what each figure is)."""

from __future__ import annotations

import statistics
from typing import Any

from tools.bench_parts.e2e.configs import CONFIGS
from tools.benchlib.stats import median_of as med, ratio
from tools.benchlib.tables import fmt, md_table

Results = dict[str, list[dict]]

RAW_ROWS = [("output tok/s (median)", "output_tokens_per_s", ""),
            ("output tokens", "output_tokens", ""), ("prompt tokens", "prompt_tokens", ""),
            ("generation wall (s)", "wall_s", "s"), ("engine start-up (s, not counted)", "startup_s", "s")]

PART2_ROWS = [
    ("output tok/s (summarize_run: first read_at to last token)", "output_tokens_per_s", ""),
    ("output tok/s, each owner's start-up removed (sum over owners)", "output_tokens_per_s_per_owner_sum", ""),
    ("owners' start skew (s)", "owner_start_skew_s", "s"),
    ("TTFT p50 (s)", "ttft_p50_s", "s"), ("TTFT p99 (s)", "ttft_p99_s", "s"),
    ("ITL p50 (ms)", "itl_p50_s", "ms"), ("ITL p99 (ms)", "itl_p99_s", "ms"),
    ("ITL max (ms)", "itl_max_s", "ms"),
    ("stalls > threshold", "stalls", ""), ("requests with stalls", "requests_with_stalls", ""),
    ("wall (s, first read to last token)", "wall_s", "s"), ("output tokens", "output_tokens", ""),
    ("engine start-up (s, not counted)", "startup_s", "s"),
]

STALL_CAUSES = {"prefill": "stalls during another request's prefill (a)",
                "remote prefill": "stalls during only a remote prefill (b)", "none": "other stalls (c)"}


def _per_repeat(runs: list[dict], key: str, unit: str = "") -> str:
    return ", ".join(fmt(r.get(key), unit) for r in runs)


def _other_load_row(a: list[dict], b: list[dict]) -> list[str]:
    return ["machine's other load (cores, median)", fmt(med(a, "cpu", "other_load_cores"), "s"),
            fmt(med(b, "cpu", "other_load_cores"), "s"), ""]


def _metric_rows(a: list[dict], b: list[dict], spec: list[tuple[str, str, str]]) -> list[list[str]]:
    """Per (label, key, unit) of ``spec``: the label, the medians of ``a`` and ``b``, b / a."""
    rows = []
    for label, key, unit in spec:
        x, y = med(a, key), med(b, key)
        rows.append([label, fmt(x, unit), fmt(y, unit), fmt(ratio(x, y), "x")])
    return rows


def _same_tokens(a: list[dict], b: list[dict]) -> str | None:
    if not a or not b:
        return None
    ta, tb = a[0].get("tokens_by_row") or {}, b[0].get("tokens_by_row") or {}
    keys = sorted(set(ta) & set(tb))
    if not keys:
        return None
    same_prompt = sum(ta[k][0] == tb[k][0] for k in keys)
    same_out = sum(ta[k][1] == tb[k][1] for k in keys)
    return f"{same_out}/{len(keys)} (prompt lengths equal: {same_prompt}/{len(keys)})"


def table_raw_vs_coloc(res: Results) -> tuple[str, dict]:
    """Part 1: raw vLLM against the pipeline colocated on all cores; and its facts (ratios)."""
    raw, col = res.get("raw", []), res.get("coloc1", [])
    rows = _metric_rows(raw, col, RAW_ROWS)
    rows.append(["output tok/s per repeat", _per_repeat(raw, "output_tokens_per_s"),
                 _per_repeat(col, "output_tokens_per_s"), ""])
    b2 = med(col, "output_tokens_per_s_from_prefill_start")
    rows.append(["pipeline tok/s from first prefill_start", "", fmt(b2),
                 fmt(ratio(med(raw, "output_tokens_per_s"), b2), "x")])
    rows.append(_other_load_row(raw, col))
    same = _same_tokens(raw, col)
    if same:
        rows.append(["rows with identical greedy output (repeat 1)", same, "", ""])
    text = md_table(["metric", "raw vLLM", "pipeline colocated", "pipeline / raw"], rows)
    return text, {"ratio": ratio(med(raw, "output_tokens_per_s"), med(col, "output_tokens_per_s")),
                  "ratio_prefill_start": ratio(med(raw, "output_tokens_per_s"), b2)}


def table_disagg_vs_coloc(res: Results, wl: str, base: str = "coloc2",
                          base_label: str = "colocated 2x1 core") -> tuple[str, dict]:
    """``base`` (default colocated) vs disaggregated on workload ``wl``; and its facts."""
    col, dis = res.get(f"{base}-{wl}", []), res.get(f"disagg-{wl}", [])
    rows = _metric_rows(col, dis, PART2_ROWS)
    for cause, what in STALL_CAUSES.items():
        a = statistics.median([r["stalls_by_cause"][cause]["count"] for r in col]) if col else None
        b = statistics.median([r["stalls_by_cause"][cause]["count"] for r in dis]) if dis else None
        am = max((r["stalls_by_cause"][cause]["max_s"] or 0 for r in col), default=None)
        bm = max((r["stalls_by_cause"][cause]["max_s"] or 0 for r in dis), default=None)
        rows.append([f"{what}: median count; longest over repeats (ms)",
                     f"{fmt(a)}; {fmt(am, 'ms')}", f"{fmt(b)}; {fmt(bm, 'ms')}", ""])
    rows.append(["output tok/s per repeat (start-up removed)",
                 _per_repeat(col, "output_tokens_per_s_per_owner_sum"),
                 _per_repeat(dis, "output_tokens_per_s_per_owner_sum"), ""])
    rows.append(["ITL max (ms) per repeat", _per_repeat(col, "itl_max_s", "ms"),
                 _per_repeat(dis, "itl_max_s", "ms"), ""])
    rows.append(_other_load_row(col, dis))
    text = md_table(["metric", base_label, "disaggregated 1P+1D", f"disagg / {base}"], rows)
    text += ("\n\n(a) the gap overlaps another request's prefill on the same engine (colocated: "
             "prefill_start to first token) or, disaggregated, another request's KV arrival and first "
             "step on the decode engine (decode_arrived_at to first token); (b) it overlaps only a "
             "prefill on the prefill worker, on the other core; (c) neither.")
    facts = {
        "tps_ratio": ratio(med(col, "output_tokens_per_s_per_owner_sum"),
                           med(dis, "output_tokens_per_s_per_owner_sum")),
        "tps_ratio_summarize_run": ratio(med(col, "output_tokens_per_s"), med(dis, "output_tokens_per_s")),
        "itl_max": (med(col, "itl_max_s"), med(dis, "itl_max_s")),
        "disagg_prefill_stalls": max((r["stalls_by_cause"]["prefill"]["count"] for r in dis), default=None),
        "disagg_prefill_stalls_max_s": max((r["stalls_by_cause"]["prefill"]["max_s"] or 0 for r in dis), default=None),
    }
    return text, facts


def _nixl_cell(runs: list[dict]) -> str:
    runs = [r for r in runs if r["handoff"].get("nixl_transfers")]
    if not runs:
        return "-"

    def m(k):
        return med(runs, "handoff", k)
    return (f"{fmt(m('nixl_transfer_p50_s'), 'ms')}; {fmt(m('nixl_post_p50_s'), 'ms')}; "
            f"{m('nixl_bytes_p50') / 2**20:.1f}; {m('nixl_gbps_p50'):.2f}")


def table_handoff(res: Results) -> str:
    """Part 3: the hand-off's parts per disaggregated request, per workload."""
    rows = []
    for wl in ("uniform", "mixed", "long"):
        runs = [r for r in res.get(f"disagg-{wl}", []) if r.get("handoff")]
        if not runs:
            continue

        def m(k, unit="ms"):
            return fmt(med(runs, "handoff", k), unit)
        rows.append([wl, f"{med(runs, 'handoff', 'requests'):.0f}",
                     f"{m('message_p50_s')} / {m('message_p99_s')} / {m('message_max_s')}",
                     f"{m('transfer_p50_s')} / {m('transfer_p99_s')} / {m('transfer_max_s')}",
                     _nixl_cell(runs), f"{m('total_p50_s')} / {m('total_p99_s')}",
                     f"{m('transfer_first_s')}; {m('transfer_first_extra_s')}"])
    return md_table(["workload", "requests", "message p50 / p99 / max (ms)",
                     "KV transfer + scheduling p50 / p99 / max (ms)",
                     "of which NIXL transfer p50 (ms; post ms; MiB; GB/s)", "total p50 / p99 (ms)",
                     "first request to arrive: transfer (ms); its extra over the median (ms)"], rows)


def table_cpu(res: Results) -> str:
    """Part 4: CPU and run-queue wait per process, engine steps, the machine's other load."""
    rows = []
    for name in CONFIGS:
        runs = res.get(name, [])
        if not runs:
            continue
        procs = sorted({p for r in runs for p in r["cpu"]["cores_by_process"]})
        for p in procs:
            v = statistics.median([r["cpu"]["cores_by_process"].get(p, 0.0) for r in runs])
            wq = statistics.median([r["cpu"].get("runqueue_wait_by_process", {}).get(p, 0.0) for r in runs])
            if v < 0.005 and wq < 0.005:
                continue
            worker = p.rsplit(" ", 2)[0] if p.endswith((" engine core", " model worker")) else p
            steps = rate = ""
            if p.endswith(" engine core") and any(worker in (r.get("steps") or {}) for r in runs):
                st = [r["steps"][worker] for r in runs if worker in r.get("steps", {})]
                steps = (f"{statistics.median([x['steps'] for x in st]):.0f} "
                         f"({statistics.median([x['idle_steps'] for x in st]):.0f})")
                rate = f"{statistics.median([x['steps_per_s'] for x in st]):.0f}"
            rows.append([name, p, f"{v:.2f}", f"{wq:.2f}", steps, rate])
        rows.append([name, "*machine: other processes' CPU; CPU pressure (PSI some)*",
                     f"{med(runs, 'cpu', 'other_load_cores'):.2f}", fmt(med(runs, "cpu", "cpu_pressure_some"), "s"),
                     "", ""])
    return md_table(["configuration", "process", "CPU (cores)", "run-queue wait (threads waiting for a CPU)",
                     "engine steps (no token computed)", "steps/s"], rows)


def table_threads(res: Results, names: list[str]) -> str:
    """The busiest threads of repeat 1 of each configuration in ``names``."""
    rows = []
    for name in names:
        runs = res.get(name, [])
        if runs:
            for t in runs[0]["cpu"]["top_threads"][:8]:
                if t["cores"] >= 0.01 or t.get("runqueue_wait", 0) >= 0.05:
                    rows.append([name, t["process"], f"`{t['thread']}`", t.get("allowed_cpus", "?"),
                                 f"{t['cores']:.2f}", f"{t.get('runqueue_wait', 0):.2f}"])
    return md_table(["configuration", "process", "thread (threads of that name)", "allowed CPUs", "CPU (cores)",
                     "run-queue wait"], rows)


def targets_table(f: dict[str, Any]) -> str:
    """The issue's targets, each with its measured value and whether it is met."""
    rows = []

    def row(name, value, ok):
        rows.append([name, value, "-" if ok is None else ("yes" if ok else "no")])
    if "raw" in f:
        r = f["raw"]["ratio"]
        row("pipeline colocated >= 0.95 x raw vLLM output tok/s",
            f"{fmt(r, 'x')} (from read_at); {fmt(f['raw']['ratio_prefill_start'], 'x')} (from prefill_start)",
            None if r is None else r >= 0.95)
    for w, goal in (("uniform", 0.85), ("mixed", 1.0)):
        if w in f:
            r = f[w]["tps_ratio"]
            row(f"disaggregated >= {goal} x colocated output tok/s ({w})",
                f"{fmt(r, 'x')} (start-up removed); {fmt(f[w]['tps_ratio_summarize_run'], 'x')} "
                f"(summarize_run)", None if r is None else r >= goal)
    if "mixed" in f:
        a, b = f["mixed"]["itl_max"]
        row("disaggregated ITL max < colocated (mixed)", f"{fmt(b, 'ms')} ms vs {fmt(a, 'ms')} ms",
            None if a is None or b is None else b < a)
        n = f["mixed"]["disagg_prefill_stalls"]
        row("no disaggregated stall > threshold overlapping another request's prefill (mixed, any repeat)",
            f"{n} (longest {fmt(f['mixed']['disagg_prefill_stalls_max_s'], 'ms')} ms)", None if n is None else n == 0)
    return md_table(["target", "measured", "met"], rows)
