"""Calibrate the planner from a finished run: read its output shards (:func:`read_run`), the
workload and model it served, and fit the ``cpu`` profile's rates to its timings
(:func:`calibrate`)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from pipeline.io.metrics import busy_seconds
from pipeline.plan.costs import prefill_flops
from pipeline.plan.hardware import Hardware, hardware
from pipeline.plan.model import ModelShape, read_json, shape_from_hf
from pipeline.plan.workload import Workload

log = logging.getLogger(__name__)


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


def run_dir_of(run_or_output: str | os.PathLike) -> Path | None:
    """The run directory of a run or output directory: the directory itself when it holds request
    metrics, else where its ``config.yaml`` is; None when neither."""
    if (Path(run_or_output) / "metrics" / "requests").is_dir():
        return Path(run_or_output)
    _, cfg_path = _output_dir(run_or_output)
    return cfg_path.parent if cfg_path is not None else None


def batch_rows_of_run(run_or_output: str | os.PathLike) -> int | None:
    """The run's ``job.batch_rows`` (rows in flight per prefill or colocated worker), from its
    ``config.yaml``; None without one."""
    cfg = _config_of_run(run_or_output)
    return int(cfg.job.batch_rows) if cfg is not None else None


def max_model_len_of_run(run_or_output: str | os.PathLike) -> int | None:
    """The run's ``model.max_model_len`` (tokens), from its ``config.yaml``; None without one."""
    cfg = _config_of_run(run_or_output)
    return int(cfg.model.max_model_len) if cfg is not None else None


def _config_of_run(run_or_output: str | os.PathLike):
    _, cfg_path = _output_dir(run_or_output)
    if cfg_path is None:
        return None
    from pipeline.config import from_yaml

    return from_yaml(cfg_path)


def timed_rows(run_or_output: str | os.PathLike) -> list[dict]:
    """The timings of a run's good rows, each ``{p, o, ps, pe, t1, tn, hand, pg, dg}``: prompt and
    output tokens; prefill start and end, first and last token (seconds on the clock of its
    group); hand-off seconds (None when colocated); ``pg`` / ``dg`` the groups whose rows share
    a clock and a prefill / decode engine.

    From the run's request metrics (``RUN_DIR/metrics/requests``, epoch seconds: every row is on
    one clock, grouped by its prefill and its decode worker) when it has them, else from the
    output shards (``queue_s`` ... ``kv_handoff_s``, seconds from its shard being read: each
    shard is its own group).

    Raises:
        FileNotFoundError: no output shards (and no request metrics).
    """
    rows = _metric_rows(run_dir_of(run_or_output))
    if rows:
        return rows
    out = []
    for g, shard in enumerate(read_run(run_or_output)):
        for r in shard:
            if r.get("ttft_s") is None:
                continue
            ps, t1 = r["queue_s"], r["queue_s"] + r["ttft_s"]
            out.append(dict(p=r["prompt_tokens"], o=r["output_tokens"], ps=ps, pe=ps + r["prefill_s"], t1=t1,
                            tn=t1 + (r.get("decode_s") or 0.0), hand=r.get("kv_handoff_s"), pg=g, dg=g))
    return out


def _metric_rows(run_dir: Path | None) -> list[dict]:
    """The timed rows of ``run_dir``'s request metrics (see :func:`timed_rows`); [] when it has
    none, or none that can be read: a part of another schema version or a damaged one (Arrow's
    error), or one the file system refuses (``OSError``): said in a warning with the cause, and
    the caller uses the output shards. Any other error is a bug and propagates."""
    if run_dir is None or not (run_dir / "metrics" / "requests").is_dir():
        return []
    import pyarrow as pa

    from pipeline.io.metrics import read_request_metrics

    try:
        table = read_request_metrics(run_dir)
    except (pa.ArrowException, OSError) as exc:
        log.warning("calibrating from the output shards: the request metrics in %s cannot be read (%s: %s)",
                    run_dir / "metrics" / "requests", type(exc).__name__, exc)
        return []
    out = []
    for r in table.to_pylist():
        times = r.get("token_times") or []
        if r.get("error") or not times or not r.get("prompt_tokens") or r.get("prefill_start") is None:
            continue
        pe = r["prefill_end"] if r.get("prefill_end") is not None else times[0]
        disagg = r.get("decode_worker") is not None
        out.append(dict(p=r["prompt_tokens"], o=r["output_tokens"], ps=r["prefill_start"], pe=pe, t1=times[0],
                        tn=times[-1], hand=times[0] - pe if disagg else None, pg=r["prefill_worker"],
                        dg=r["decode_worker"] if disagg else r["prefill_worker"]))
    return out


def dram_write_rate(run_dir: Path | None) -> float | None:
    """Bytes/s of a run's KV writes into the decode DRAM tier: their bytes / their seconds from
    post to completion, summed over the prefill workers' steps (``kv_transfer_bytes`` /
    ``kv_transfer_s`` beside ``kv_held_s``, :mod:`pipeline.io.metrics`); None for a run without
    the tier or its metrics."""
    if run_dir is None or not (run_dir / "metrics" / "workers").is_dir():
        return None
    from pipeline.io.metrics import read_worker_metrics

    nbytes = seconds = 0.0
    for s in read_worker_metrics(run_dir).to_pylist():
        if s["role"] == "prefill" and s["kv_held_s"]:
            nbytes += sum(s["kv_transfer_bytes"] or ())
            seconds += sum(s["kv_transfer_s"] or ())
    return nbytes / seconds if seconds > 0 else None


def _groups(rows: list[dict], key: str) -> list[list[dict]]:
    by: dict = {}
    for r in rows:
        by.setdefault(r[key], []).append(r)
    return list(by.values())


def calibrate(run_or_output: str | os.PathLike, model: ModelShape | None = None,
              base: Hardware | str = "cpu") -> Hardware:
    """Fit ``base`` (the ``cpu`` profile) to a finished run: effective FLOP/s, memory bandwidth,
    link bandwidth and hand-off latency, returned with ``mfu = mbu = 1`` so they are used as
    measured.

    Reads each good row's timings (:func:`timed_rows`): from the run's request metrics, where all
    rows share one clock and are grouped by the worker that served them, else from the output
    shards, where each shard has its own clock (the shard being read) and is its own group. A row
    is in prefill over ``[prefill start, prefill end]``, hands off over ``[prefill end, first
    token]`` and decodes over ``[first token, last token]``. Rows of a group prefilled together
    share the engine, so:

    - FLOP/s = sum of :func:`prefill_flops` / sum over prefill groups of the union of prefill
      intervals (the engine's busy time: a row waiting in the engine waits for other rows'
      prefill);
    - memory bytes/s = sum over rows of ``steps x bytes per step`` / sum of decode seconds, with
      ``steps = output_tokens - 1`` and bytes per step = weights + the KV (``k x (p + o/2)``) of
      every row of the decode group decoding alongside, weighted by the time it overlaps;
    - link bytes/s = sum of ``k x prompt_tokens`` / sum over prefill groups of the union of
      hand-off intervals (disaggregated runs only; otherwise ``base``'s): what the hand-offs move
      per second of hand-off, the rate that loads the link. A run with the decode DRAM tier
      (``offload=dram``) measured its writes themselves: there it is their bytes / their
      seconds (NIXL's own timings, :func:`dram_write_rate`), as a hand-off then also holds the
      wait for a decode slot;
    - hand-off latency ``handoff_s`` = mean over rows of (hand-off seconds - ``k x p / link``):
      what a hand-off takes beyond moving its bytes (messages, decode scheduling, waiting for the
      prefill engine's step boundary), which TTFT pays and the link's load does not.

    Output shards alone (no metrics) make the fit conservative when a worker serves several
    shards at once: rows of different shards are taken not to overlap. Per-step overheads
    (Python, scheduling) are folded into the fitted rates. The rates are per worker as that run
    placed them: the local launcher splits the cores among the workers (a 1P:1D run on 2 cores
    gives each one core, a colocated x1 run both), so calibrate from a run laid out like the one
    to predict. On a device profile (``base`` not a CPU one, see
    :attr:`~pipeline.plan.hardware.Hardware.ranks_share_cores`) they are then divided per device
    by the run's TP sizes (its ``config.yaml``): FLOP/s by ``model.prefill_tp`` (the prefill or
    colocated workers), memory bytes/s by ``model.decode_tp`` (colocated: ``prefill_tp``), link
    bytes/s by the smaller of the two (the links a hand-off uses,
    :func:`pipeline.plan.predict.prefill_side`), as the planner multiplies them back by each
    pool's TP size. On a CPU profile they stay per worker: its ranks share its cores.

    ``model`` defaults to the run's (its ``config.yaml``).

    Raises:
        FileNotFoundError: no output shards.
        ValueError: no row with prefill / decode timings to fit.
    """
    base = hardware(base) if isinstance(base, str) else base
    model = model or model_of_run(run_or_output)
    rows = timed_rows(run_or_output)
    k = model.kv_bytes_per_token
    flops = sum(prefill_flops(model, r["p"]) for r in rows)
    prefill_busy = sum(busy_seconds([(r["ps"], r["pe"]) for r in g]) for g in _groups(rows, "pg"))
    dec_bytes = dec_time = 0.0
    for g in _groups(rows, "dg"):
        dec = [(r["t1"], r["tn"], k * (r["p"] + r["o"] / 2), r) for r in g if r["o"] >= 2 and r["tn"] > r["t1"]]
        for a, b, _, r in dec:
            kv = sum(kvj * max(0.0, min(b, bj) - max(a, aj)) / (b - a) for aj, bj, kvj, _ in dec)
            dec_bytes += (r["o"] - 1) * (model.weight_bytes + kv)
            dec_time += b - a
    hand = [r for r in rows if r["hand"] is not None]
    kv_moved = sum(k * r["p"] for r in hand)
    handoff_busy = sum(busy_seconds([(r["pe"], r["pe"] + r["hand"]) for r in g]) for g in _groups(hand, "pg"))
    if prefill_busy <= 0 or dec_time <= 0:
        raise ValueError(f"{run_or_output}: no rows with prefill and decode timings to calibrate from")
    run_tps = _tp_sizes(run_or_output)
    ptp, dtp = (1, 1) if base.ranks_share_cores else run_tps
    links = min(ptp, dtp)
    # The tier's writes are per prefill rank (each its heads' share, all ranks at once): the
    # worker's rate is the prefill TP times theirs.
    dram = dram_write_rate(run_dir_of(run_or_output))
    link = (dram * run_tps[0] if dram else kv_moved / handoff_busy if handoff_busy > 0 else base.link_bw * links)
    latency = max(0.0, sum(r["hand"] - k * r["p"] / link for r in hand) / len(hand)) if hand else base.handoff_s
    return replace(base, name=f"{base.name} calibrated on {run_or_output}", peak_flops=flops / prefill_busy / ptp,
                   mfu=1.0, mem_bw=dec_bytes / dec_time / dtp, mbu=1.0, link_bw=link / links, handoff_s=latency)


def _tp_sizes(run_or_output: str | os.PathLike) -> tuple[int, int]:
    """(prefill or colocated TP, decode TP) of a run, from its ``config.yaml``; (1, 1) without one."""
    cfg = _config_of_run(run_or_output)
    if cfg is None:
        return 1, 1
    roles = ("colocated", "colocated") if cfg.pools.mode == "colocated" else ("prefill", "decode")
    return cfg.model.tp_of(roles[0]), cfg.model.tp_of(roles[1])
