"""Calibrate the planner from a finished run: read its output shards (:func:`read_run`), the
workload and model it served, and fit the ``cpu`` profile's rates to its timings
(:func:`calibrate`)."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from pipeline.plan.costs import prefill_flops
from pipeline.plan.hardware import Hardware, hardware
from pipeline.plan.model import ModelShape, read_json, shape_from_hf
from pipeline.plan.workload import Workload


def _output_dir(run_or_output: str | os.PathLike) -> tuple[Path, Path | None]:
    """(output shard directory, run config.yaml or None) for a run dir or its output dir."""
    p = Path(run_or_output)
    if (p / "config.yaml").exists():
        from pipeline.config import from_yaml

        cfg = from_yaml(p / "config.yaml")
        out = Path(cfg.job.output) if cfg.job.output and "://" not in cfg.job.output else p / "output"
        return out, p / "config.yaml"
    if (p.parent / "config.yaml").exists():
        return p, p.parent / "config.yaml"
    return p, None


def read_run(run_or_output: str | os.PathLike) -> list[list[dict]]:
    """The rows of a run's output shards, one list per shard (rows with an error or without
    timings left out). Accepts the run directory or the output directory.

    Raises:
        FileNotFoundError: no ``*.parquet`` there.
    """
    import pyarrow.parquet as pq

    from pipeline.io.shards import output_files

    out, _ = _output_dir(run_or_output)
    files = output_files(str(out))
    if not files:
        raise FileNotFoundError(f"no output shards (*.parquet) in {out}")
    cols = ["prompt_tokens", "output_tokens", "queue_s", "prefill_s", "ttft_s", "decode_s", "kv_handoff_s", "error"]
    shards = []
    for f in files:
        table = pq.read_table(f)
        have = [c for c in cols if c in table.column_names]
        rows = [r for r in table.select(have).to_pylist()
                if not r.get("error") and r.get("prefill_s") is not None and r.get("prompt_tokens")]
        for r in rows:
            r.setdefault("queue_s", 0.0)
            r["queue_s"] = r["queue_s"] or 0.0
        shards.append(rows)
    return shards


def workload_from_run(run_or_output: str | os.PathLike, rate: float | None = None) -> Workload:
    """The workload a run served: its rows' prompt and output tokens, as a batch of its row count
    (or at ``rate``).

    Raises:
        FileNotFoundError: no output shards.
        ValueError: no row without an error.
    """
    rows = [r for shard in read_run(run_or_output) for r in shard]
    if not rows:
        raise ValueError(f"no successful rows in {run_or_output}")
    return Workload(tuple(r["prompt_tokens"] for r in rows), tuple(max(1, r["output_tokens"]) for r in rows),
                    rate, None if rate is not None else len(rows), source=f"run {run_or_output} ({len(rows)} rows)")


def model_of_run(run_or_output: str | os.PathLike) -> ModelShape:
    """The model a run used, from its saved ``config.yaml`` (next to the output directory).

    Raises:
        ValueError: no ``config.yaml`` found.
    """
    _, cfg_path = _output_dir(run_or_output)
    if cfg_path is None:
        raise ValueError(f"no config.yaml for {run_or_output}; pass the model (--model)")
    from pipeline.config import from_yaml
    from pipeline.engine.model import model_path

    cfg = from_yaml(cfg_path)
    path = model_path(cfg)
    return shape_from_hf(read_json(Path(path) / "config.json"), cfg.model.name, cfg.model.dtype, path)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def calibrate(run_or_output: str | os.PathLike, model: ModelShape | None = None,
              base: Hardware | str = "cpu") -> Hardware:
    """Fit ``base`` (the ``cpu`` profile) to a finished run: effective FLOP/s, memory bandwidth
    and link bandwidth, returned with ``mfu = mbu = 1`` so they are used as measured.

    Reads the output shards (``prompt_tokens``, ``output_tokens``, ``queue_s``, ``prefill_s``,
    ``ttft_s``, ``decode_s``, ``kv_handoff_s``; :mod:`pipeline.io.output`). Times of one shard
    share an origin (the shard being read): a row is in prefill over ``[queue_s, queue_s +
    prefill_s]``, decodes over ``[queue_s + ttft_s, + decode_s]`` and hands off over
    ``[queue_s + prefill_s, + kv_handoff_s]``. Rows prefilled together share the engine, so:

    - FLOP/s = sum of :func:`prefill_flops` / sum over shards of the union of prefill intervals;
    - memory bytes/s = sum over rows of ``steps x bytes per step`` / sum of ``decode_s``, with
      ``steps = output_tokens - 1`` and bytes per step = weights + the KV (``k x (p + o/2)``) of
      every row of the shard decoding alongside, weighted by the time it overlaps;
    - link bytes/s = sum of ``k x prompt_tokens`` / sum over shards of the union of hand-off
      intervals (disaggregated runs only; otherwise ``base``'s).

    Rows of different shards are taken not to overlap (the output has no common clock), which
    makes the fit conservative when a worker serves several shards at once. Per-step overheads
    (Python, scheduling, hand-off messages) are folded into the fitted rates. The rates are per
    worker as that run placed them: the local launcher splits the cores among the workers (a
    1P:1D run on 2 cores gives each one core, a colocated x1 run both), so calibrate from a run
    laid out like the one to predict.

    ``model`` defaults to the run's (its ``config.yaml``).

    Raises:
        FileNotFoundError: no output shards.
        ValueError: no row with prefill / decode timings to fit.
    """
    base = hardware(base) if isinstance(base, str) else base
    model = model or model_of_run(run_or_output)
    shards = read_run(run_or_output)
    k = model.kv_bytes_per_token
    flops = prefill_busy = 0.0
    dec_bytes = dec_time = 0.0
    kv_moved = handoff_busy = 0.0
    for rows in shards:
        if not rows:
            continue
        flops += sum(prefill_flops(model, r["prompt_tokens"]) for r in rows)
        prefill_busy += _union([(r["queue_s"], r["queue_s"] + r["prefill_s"]) for r in rows])
        dec = [(r["queue_s"] + r["ttft_s"], r["queue_s"] + r["ttft_s"] + r["decode_s"],
                k * (r["prompt_tokens"] + r["output_tokens"] / 2), r)
               for r in rows if r.get("ttft_s") is not None and r.get("decode_s") and r["output_tokens"] >= 2]
        for a, b, _, r in dec:
            kv = sum(kvj * max(0.0, min(b, bj) - max(a, aj)) / (b - a) for aj, bj, kvj, _ in dec)
            dec_bytes += (r["output_tokens"] - 1) * (model.weight_bytes + kv)
            dec_time += r["decode_s"]
        hand = [r for r in rows if r.get("kv_handoff_s") is not None]
        if hand:
            kv_moved += sum(k * r["prompt_tokens"] for r in hand)
            handoff_busy += _union([(r["queue_s"] + r["prefill_s"], r["queue_s"] + r["prefill_s"] + r["kv_handoff_s"])
                                    for r in hand])
    if prefill_busy <= 0 or dec_time <= 0:
        raise ValueError(f"{run_or_output}: no rows with prefill and decode timings to calibrate from")
    return replace(base, name=f"{base.name} calibrated on {run_or_output}", peak_flops=flops / prefill_busy,
                   mfu=1.0, mem_bw=dec_bytes / dec_time, mbu=1.0,
                   link_bw=kv_moved / handoff_busy if handoff_busy > 0 else base.link_bw)
