"""The elastic-pools part of ``tools/bench.py`` (issue #40): four workloads, each run static
(disaggregated 1P:1D), colocated (2 workers) and elastic (1P:1D with ``pools.elastic=true``) on
the same 2 cores, and the table that judges elastic against the better of the other two.

Workloads (short rows: standard-library docstrings of ~150-350 tokens, as ``uniform``; long rows:
several docstrings cut to ~``--long-tokens`` tokens, as ``mixed``'s; every output runs to its
length, ``job.sampling.ignore_eos=true``, except in ``mixed``):

- ``prefill``: prefill-heavy, every row long, 8 new tokens;
- ``decode``: decode-heavy, every row short, 256 new tokens;
- ``mixed``: the existing one (a quarter of the rows long, ``--max-new-tokens``);
- ``skewed``: every row short, each its own ``max_new_tokens`` (``sampling_params`` column)
  spread log-evenly over 4-256 and shuffled (fixed seed), so that a few rows decode for long.
"""

from __future__ import annotations

import os
import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from tools.benchlib.stats import median_of as med
from tools.benchlib.tables import fmt, md_table

#: workload -> overrides (its output lengths; ``mixed`` keeps ``--max-new-tokens``)
ELASTIC_WORKLOADS = {
    "prefill": ["job.sampling.max_new_tokens=8", "job.sampling.ignore_eos=true"],
    "decode": ["job.sampling.max_new_tokens=256", "job.sampling.ignore_eos=true"],
    "mixed": [],
    "skewed": ["job.sampling.max_new_tokens=256", "job.sampling.ignore_eos=true"],
}
SKEW_RANGE = (4, 256)
#: the starting splits of 4 workers on the 4-node test Slurm (``--only slurm``)
SLURM_SPLITS = ("1p3d", "2p2d", "3p1d")
#: columns of the elastic table, in this order
KINDS = (("coloc2", "colocated 2 workers"), ("disagg", "static 1P:1D"), ("disaggelastic", "elastic 1P:1D"),
         ("disaggelastic1ms", "elastic 1P:1D, NIXL progress thread every 1 ms"))


def skewed_lengths(n: int, seed: int = 40) -> list[int]:
    """``n`` output lengths spread log-evenly over :data:`SKEW_RANGE`, shuffled with ``seed``."""
    lo, hi = SKEW_RANGE
    out = [round(lo * (hi / lo) ** (i / max(1, n - 1))) for i in range(n)]
    random.Random(seed).shuffle(out)
    return out


def write_elastic_workloads(work: Path, rows: int, shards: int, short: list[tuple[str, str]],
                            longs: list[tuple[str, str]], tokenizer: Any) -> dict[str, dict]:
    """Write ``work/inputs/{prefill,decode,skewed}/part-NNNNN.parquet`` (``rows`` rows over
    ``shards`` shards; ``short`` and ``longs``: (module, text) to take rows from) and return per
    workload its directory and prompt-size facts, as :func:`build_workloads` does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = skewed_lengths(rows)
    out = {}
    for wl in ("prefill", "decode", "skewed"):
        src = longs if wl == "prefill" else short
        if len(src) < rows:
            raise SystemExit(f"--workloads {wl}: only {len(src)} distinct documents for {rows} rows")
        per = [rows // shards + (1 if i < rows % shards else 0) for i in range(shards)]
        d = work / "inputs" / wl
        d.mkdir(parents=True, exist_ok=True)
        k = 0
        for s, n in enumerate(per):
            recs = []
            for r in range(n):
                m, t = src[k]
                rec = {"id": f"{wl}-{s}-{r}", "module": m, "kind": "long" if wl == "prefill" else "short", "text": t}
                if wl == "skewed":
                    rec["sampling_params"] = {"max_new_tokens": lengths[k]}
                recs.append(rec)
                k += 1
            pq.write_table(pa.Table.from_pylist(recs), d / f"part-{s:05d}.parquet")
        toks = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for _, t in src[:rows]]
        out[wl] = {"dir": str(d), "rows": rows, "shards": shards, "text_tokens": toks,
                   "long_rows": rows if wl == "prefill" else 0, "text_tokens_total": sum(toks),
                   **({"max_new_tokens": lengths} if wl == "skewed" else {})}
    return out


def rows_by_path(cols: dict[str, list]) -> dict[str, int]:
    """Output rows by how they were served: ``handed_off`` (prefill worker, then a decode rank),
    ``decode_alone`` (a decode rank's own unit), ``prefill_alone`` (a prefill or colocated
    worker's engine alone)."""
    out = {"handed_off": 0, "decode_alone": 0, "prefill_alone": 0}
    for p, d in zip(cols["prefill_worker"], cols["decode_worker"]):
        out["handed_off" if d else "decode_alone" if (p or "").startswith("decode-") else "prefill_alone"] += 1
    return out


def decode_rank_itl_p99(cols: dict[str, list]) -> float | None:
    """ITL p99 (seconds) over the rows a decode rank decoded: handed off to it, or its own."""
    import numpy as np

    gaps = [b - a for p, d, tt in zip(cols["prefill_worker"], cols["decode_worker"], cols["token_times"])
            if tt and (d or (p or "").startswith("decode-")) for a, b in zip(tt, tt[1:])]
    return float(np.percentile(gaps, 99)) if gaps else None


def step_s(run_dir: Path, rows: int) -> dict[str, float]:
    """Engine (worker name without host) -> its median step (seconds) over steps with exactly
    ``rows`` rows running, each generating a token and none prefilling, after a step with as
    many rows (so that the gap is one step's), from the run's step records
    (``metrics/workers``); engines with fewer than 20 such steps are left out."""
    from pipeline.io.metrics import read_worker_metrics

    t = read_worker_metrics(run_dir, ["worker", "t", "running", "generation_tokens", "prompt_tokens"]).to_pylist()
    by: dict[str, list[dict]] = defaultdict(list)
    for r in t:
        by[r["worker"].split("@")[0]].append(r)
    out = {}
    for w, steps in by.items():
        steps.sort(key=lambda r: r["t"])
        gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:]) if a["running"] == rows == b["running"]
                and b["generation_tokens"] == rows and not b["prompt_tokens"]]
        if len(gaps) >= 20:
            out[w] = statistics.median(gaps)
    return out


def run_step_s(run_dir: Path, rows: int) -> float | None:
    """The median over a run's engines of :func:`step_s` (seconds; None: no engine had 20 such
    steps): what the run's window is divided by to give it in steps (:func:`window_steps`)."""
    steps = step_s(run_dir, rows)
    return statistics.median(steps.values()) if steps else None


def window_steps(rs: list[dict]) -> float | None:
    """The median over runs of each run's window (first row read to last token, ``wall_s``)
    over its engines' step at equal rows (``step_s``: :func:`run_step_s`): the window in steps,
    which the engines' own speed does not move. On the capped test Slurm an engine's step at 4
    rows moved 1.6x between rounds of one bench, and makespans with it."""
    vals = [r["wall_s"] / r["step_s"] for r in rs if r.get("step_s") and r.get("wall_s")]
    return statistics.median(vals) if vals else None


def _busy(r: dict, role: str) -> float | None:
    vals = [v for w, v in (r.get("busy_fraction") or {}).items() if w.startswith(role) and v is not None]
    return statistics.mean(vals) if vals else None


def table_elastic(results: dict[str, list[dict]]) -> tuple[str, dict]:
    """One row per workload and kind (:data:`KINDS`): makespan (launch to exit, and first row
    read to last token), each pool's busy fraction, decode ranks' ITL p99, rows by path; and the
    facts: per workload, elastic's makespan over the best of static and colocated."""
    rows, facts = [], {}
    for wl in ELASTIC_WORKLOADS:
        runs = {k: results.get(f"{k}-{wl}", []) for k, _ in KINDS}
        if not runs["disaggelastic"]:
            continue
        best = min((med(runs[k], "process_s"), k) for k in ("coloc2", "disagg") if runs[k])
        for k, label in KINDS:
            rs = runs[k]
            if not rs:
                continue
            paths = rs[0].get("rows_by_path") or {}
            busy_a = statistics.median([b for b in (_busy(r, "prefill" if k != "coloc2" else "colocated") for r in rs)
                                        if b is not None] or [0])
            busy_b = statistics.median([b for b in (_busy(r, "decode") for r in rs) if b is not None] or [0])
            ratio = med(rs, "process_s") / best[0]
            rows.append([wl, label, fmt(med(rs, "process_s"), "s"), fmt(med(rs, "wall_s"), "s"), fmt(ratio, "x"),
                         f"{busy_a:.2f}" + (f" / {busy_b:.2f}" if k != "coloc2" else ""),
                         fmt(med(rs, "decode_rank_itl_p99_s"), "ms"),
                         f"{paths.get('handed_off', 0)} / {paths.get('decode_alone', 0)} / {paths.get('prefill_alone', 0)}",
                         len(rs)])
        facts[wl] = {"elastic_over_best": med(runs["disaggelastic"], "process_s") / best[0], "best": best[1]}
    text = md_table(["workload", "pools", "makespan s (median)", "first read to last token s", "/ best of static, colocated",
                     "busy: prefill (colocated: workers) / decode", "decode ITL p99 ms", "rows handed off / decode alone / prefill alone (repeat 1)",
                     "repeats"], rows, "llrrrrrrr")
    return text, facts


def table_elastic_slurm(results: dict[str, list[dict]]) -> tuple[str, dict]:
    """The test Slurm's table (``--only slurm``): per workload, colocated 4 workers, then each
    split of :data:`SLURM_SPLITS` static and elastic; elastic's makespan over the best of
    (colocated, the best static split). Facts: per workload and split, that ratio."""
    rows, facts = [], {}
    for wl in ELASTIC_WORKLOADS:
        static = {s: results.get(f"slurm{s}-{wl}", []) for s in SLURM_SPLITS}
        elastic = {s: results.get(f"slurm{s}elastic-{wl}", []) for s in SLURM_SPLITS}
        coloc = results.get(f"slurmcoloc4-{wl}", [])
        cands = [(med(rs, "process_s"), k) for k, rs in [("colocated", coloc), *static.items()] if rs]
        if not cands or not any(elastic.values()):
            continue
        best = min(cands)
        best_steps = min((w for rs in [coloc, *static.values()] if (w := window_steps(rs))), default=None)
        for label, rs, k in [("colocated 4 workers", coloc, "c"), *[(f"{kind} {s[0]}P:{s[2]}D", rs, kind[0])
                             for s in SLURM_SPLITS for kind, rs in (("static", static[s]), ("elastic", elastic[s]))]]:
            if not rs:
                continue
            paths = rs[0].get("rows_by_path") or {}
            ratio = med(rs, "process_s") / best[0]
            busy = (f"{statistics.median([_busy(r, 'colocated') or 0 for r in rs]):.2f}" if k == "c" else
                    f"{statistics.median([_busy(r, 'prefill') or 0 for r in rs]):.2f} / "
                    f"{statistics.median([_busy(r, 'decode') or 0 for r in rs]):.2f}")
            steps = window_steps(rs)
            in_steps = "-" if steps is None else f"{steps:.0f}" + (f" ({steps / best_steps:.2f}x)" if best_steps else "")
            rows.append([wl, label, fmt(med(rs, "process_s"), "s"), fmt(med(rs, "wall_s"), "s"), fmt(ratio, "x"),
                         in_steps, busy, fmt(med(rs, "decode_rank_itl_p99_s"), "ms"),
                         f"{paths.get('handed_off', 0)} / {paths.get('decode_alone', 0)} / {paths.get('prefill_alone', 0)}",
                         len(rs)])
            if k == "e":
                facts[f"{wl}-{label.split()[1]}"] = {"elastic_over_best": ratio, "best": best[1],
                                                     "steps_over_best": steps / best_steps if steps and best_steps else None}
    cap = slurm_node_cpus()
    facts["node_cpus"] = cap
    note = (f"Each test node capped at {cap:g} cores (`start-test-cluster.sh --node-cpus {cap:g}`).\n\n" if cap else
            "Test nodes not capped: they share the machine's cores, an idle node's share going to the busy ones "
            "(`start-test-cluster.sh --node-cpus F` caps them).\n\n")
    text = note + md_table(["workload", "pools", "makespan s (median)", "first read to last token s",
                     "/ best of static splits, colocated", "that window in steps (/ the best's)",
                     "busy: prefill (colocated: workers) / decode",
                     "decode ITL p99 ms", "rows handed off / decode alone / prefill alone (repeat 1)", "repeats"],
                    rows, "llrrrrrrrr")
    return text, facts


def slurm_node_cpus() -> float | None:
    """The test Slurm's cap on each node's CPU (cores; ``slurm/start-test-cluster.sh --node-cpus``,
    kept in ``$PD_SLURM_STATE/node-cpus``), or None when its nodes share the machine's cores."""
    try:
        return float((Path(os.environ.get("PD_SLURM_STATE", "/var/tmp/pd-slurm")) / "node-cpus").read_text())
    except (OSError, ValueError):
        return None
