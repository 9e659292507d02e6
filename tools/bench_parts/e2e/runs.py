"""One run of a ``tools/bench.py`` configuration, a pipeline run or raw vLLM, and its figures."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from pipeline.run import planned
from pipeline.runtime.rundir import RunDir
from tools.bench_parts.e2e.configs import base_overrides, pipeline_overrides
from tools.bench_parts.e2e.elastic import decode_rank_itl_p99, rows_by_path, run_step_s
from tools.bench_parts.e2e.metrics import handoff_parts, per_owner_throughput, stall_attribution, worker_steps
from tools.bench_parts.e2e.processes import RunError, label_processes, run_sampled
from tools.benchlib import REPO
from tools.benchlib.procfs import load_1m
from tools.benchlib.procs import pipeline_command, python

SUMMARY_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "itl_max_s", "stalls",
                "requests_with_stalls", "kv_handoff_p50_s", "kv_handoff_p99_s", "kv_total_bytes",
                "mean_batch_size", "max_batch_size", "busy_fraction")


def run_pipeline_config(name: str, rep: int, args: argparse.Namespace, wl: dict, work: Path) -> dict[str, Any]:
    """Run configuration ``name`` (repeat ``rep``) on workload ``wl`` and measure it."""
    from pipeline.io.metrics import read_request_metrics, read_worker_metrics
    from pipeline.report.summary import summarize_run

    overrides, roles = pipeline_overrides(name, args, wl)
    run_dir = work / "runs" / f"{name}-r{rep}"
    cmd = pipeline_command(*overrides, f"run.dir={run_dir}", f"job.output={run_dir}/output",
                           "run.progress=false", "run.report=false")
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a retried run starts afresh (not a resume)
    log = work / "runs" / f"{name}-r{rep}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    load0 = load_1m()
    rc, sampler, t_launch, leftovers = run_sampled(cmd, log, args)
    t_end = time.time()
    if rc != 0:
        raise RunError(f"{name} repeat {rep}: exit status {rc}; log {log} and {run_dir}/logs:\n"
                       f"{log.read_text()[-1500:]}")
    rep_ = summarize_run(run_dir, args.stall_ms / 1e3)
    cols = read_request_metrics(run_dir).to_pydict()
    steps = read_worker_metrics(run_dir).to_pydict()
    t0 = min(x for x in cols["read_at"] if x is not None)
    p0 = min(x for x in cols["prefill_start"] if x is not None)
    t1 = max(tt[-1] for tt in cols["token_times"] if tt)
    labels = label_processes(sampler, roles)
    out = {
        "config": name, "repeat": rep, "run_dir": str(run_dir), "command": " ".join(cmd[1:]),
        "output_tokens": rep_["output_tokens"], "prompt_tokens": rep_["prompt_tokens"],
        "requests": rep_["requests"], "errors": rep_["errors"],
        "wall_s": rep_["wall_s"], "output_tokens_per_s": rep_["output_tokens_per_s"],
        "output_tokens_per_s_from_prefill_start": rep_["output_tokens"] / (t1 - p0),
        **per_owner_throughput(cols),
        "startup_s": t0 - t_launch, "process_s": t_end - t_launch,
        "stalls_by_cause": stall_attribution(cols, args.stall_ms / 1e3),
        "handoff": handoff_parts(cols, steps),
        "steps": worker_steps(steps, t0, t1),
        "cpu": sampler.window(t0, t1, labels),
        "loadavg_1m_before": load0, "leftover_processes_killed": leftovers,
        "itl_zero_gap_fraction": rep_["itl_zero_gaps"] / rep_["itl_gaps"] if rep_["itl_gaps"] else None,
    }
    for k in SUMMARY_KEYS:
        out[k] = rep_[k]
    out["tokens_by_row"] = _output_tokens_by_row(run_dir)
    out["rows_by_path"], out["decode_rank_itl_p99_s"] = rows_by_path(cols), decode_rank_itl_p99(cols)
    # Each engine's step at a quarter of the rows in flight (one colocated worker's rows of 4): the window in steps
    out["step_rows"] = max(1, args.inflight // 4)
    out["step_s"] = run_step_s(run_dir, out["step_rows"])
    if (choice := planned(RunDir(run_dir))) is not None:  # pools=auto: what it chose
        out["auto_choice"] = choice["choice"]
    return out


def _output_tokens_by_row(run_dir: Path) -> dict[str, list]:
    import pyarrow.parquet as pq

    out = {}
    for p in sorted((run_dir / "output").glob("*.parquet")):
        t = pq.read_table(p, columns=["id", "prompt_tokens", "generation_token_ids"]).to_pydict()
        for i, pt, g in zip(t["id"], t["prompt_tokens"], t["generation_token_ids"]):
            out[str(i)] = [pt, g]
    return out


def run_raw(rep: int, args: argparse.Namespace, wl: dict, work: Path) -> dict[str, Any]:
    """raw vLLM in a child process (``tools/bench.py --_raw``, see
    :mod:`tools.bench_parts.e2e.raw`), its process tree sampled like a pipeline run."""
    from pipeline.launch.local import cpu_slices

    cpus = cpu_slices(1, "partition")[0]
    spec = work / "runs" / f"raw-r{rep}.spec.json"
    res = work / "runs" / f"raw-r{rep}.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"overrides": base_overrides(args, wl["dir"]), "cpus": cpus}))
    log = work / "runs" / f"raw-r{rep}.log"
    load0 = load_1m()
    cmd = python(REPO / "tools" / "bench.py", "--_raw", spec, res)
    rc, sampler, _, leftovers = run_sampled(cmd, log, args)
    if rc != 0:
        raise RunError(f"raw repeat {rep}: exit status {rc}; log {log}:\n{log.read_text()[-1500:]}")
    r = json.loads(res.read_text())
    labels = label_processes(sampler, {cpus: "raw"})
    labels[sampler.root] = "raw front-end"
    r.update({"config": "raw", "repeat": rep, "leftover_processes_killed": leftovers,
              "cpu": sampler.window(r["t0"], r["t1"], labels), "loadavg_1m_before": load0})
    return r
