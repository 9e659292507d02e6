"""Per-request and per-worker metrics, written as Parquet in the run directory next to the output.

``RUN_DIR/metrics/requests/<shard name>/part-<n>.parquet``: one row per served row (rows that
became error rows before prefill, such as empty text, have no metrics). Written by the shard's
owner each time it checkpoints a batch of finished rows, so a resumed run keeps the metrics of
rows finished before the interruption. All times are wall-clock seconds since the epoch
(``time.time()``), so rows from different workers on one node line up; across nodes they are as
good as the nodes' clock synchronisation (NTP: ~1 ms).

==================  =============  ======================================================
column              type           meaning
==================  =============  ======================================================
key                 string         ``"<shard index>:<row index>"``
shard               string         input shard file name
row                 int64          row index in the shard
prefill_worker      string         worker id of the prefill (or colocated) worker
decode_worker       string         worker id of the decode worker; null when colocated
read_at             float64        the shard was read (the row became ready to serve)
prefill_start       float64        the row entered prefill (queue wait = this - read_at)
prefill_end         float64        prefill finished: KV ready for hand-off (null colocated)
decode_arrived_at   float64        the hand-off reached the decode worker (null colocated)
token_times         list<float64>  when each output token was seen, one per token
prompt_tokens       int32          tokens in the prompt
output_tokens       int32          tokens generated
kv_tokens           int64          prompt tokens whose KV decode received over NIXL
kv_bytes            int64          kv_tokens x KV bytes per token
prefix_cached_tokens int64         prompt tokens the prefill engine found in its prefix cache
tries               int32          times the row was prefilled (> 1 after a lost hand-off)
error               string         null unless the row failed while being served
capacity_wait_s     float64        seconds the prefill worker waited for DRAM-tier slots before the
                                   prefill (``offload=dram``; null otherwise)
==================  =============  ======================================================

Derived (see :func:`request_summary`): TTFT = ``token_times[0] - prefill_start``; ITL = the
differences of consecutive ``token_times``; KV hand-off = ``token_times[0] - prefill_end``.

``RUN_DIR/metrics/workers/<worker id>.<pid>.<part>.parquet``: one row per engine step of one
worker, written by a vLLM stat logger (:class:`StepRecorder`): a new part holds the steps since the
previous one, written every ``FLUSH_EVERY_S`` seconds while the worker runs and when it stops.

==================  =========  ============================================================
column              type       meaning
==================  =========  ============================================================
worker              string     worker id ("prefill-0@host", "decode-1@host", "colocated-0@host")
role                string     "prefill" | "decode" | "colocated"
t                   float64    when the step's outputs were processed (epoch seconds)
running             int32      requests in the running batch (the batch size of the step)
waiting             int32      requests waiting (including those waiting for remote KV)
kv_cache_usage      float64    fraction of the KV cache's blocks in use, 0..1
prompt_tokens       int32      prompt tokens computed in the step
generation_tokens   int32      output tokens produced in the step
prefix_cache_queries int64     prompt tokens looked up in the local prefix cache in the step
prefix_cache_hits   int64      of those, tokens found (their KV neither computed nor received)
kv_post_s           list       per KV transfer this worker initiated that completed in the step:
kv_transfer_s       list         seconds posting it, seconds from post to completion,
kv_transfer_bytes   list         bytes moved,
kv_transfer_descriptors list     NIXL descriptors it took (NIXL's telemetry)
kv_held_s           list       offload=dram: seconds from prefill end to its KV write completing
kv_freed_s          list       offload=dram: seconds from prefill end to vLLM freeing its blocks
kv_load_tokens      list       offload=dram, decode: per load from the DRAM tier, tokens loaded,
kv_load_recompute_tokens list    tokens computed after it,
kv_load_after_preemption list    1 if the request came back after a preemption
prompt_tokens_computed int32   prompt tokens computed in the step (not cached, not received)
preempted           int32      requests preempted in the step
==================  =========  ============================================================

vLLM's prefix-cache hit rate of a worker = sum(prefix_cache_hits) / sum(prefix_cache_queries).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REQUEST_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("shard", pa.string()),
    ("row", pa.int64()),
    ("prefill_worker", pa.string()),
    ("decode_worker", pa.string()),
    ("read_at", pa.float64()),
    ("prefill_start", pa.float64()),
    ("prefill_end", pa.float64()),
    ("decode_arrived_at", pa.float64()),
    ("token_times", pa.list_(pa.float64())),
    ("prompt_tokens", pa.int32()),
    ("output_tokens", pa.int32()),
    ("kv_tokens", pa.int64()),
    ("kv_bytes", pa.int64()),
    ("prefix_cached_tokens", pa.int64()),
    ("tries", pa.int32()),
    ("error", pa.string()),
    ("capacity_wait_s", pa.float64()),
])

WORKER_SCHEMA = pa.schema([
    ("worker", pa.string()),
    ("role", pa.string()),
    ("t", pa.float64()),
    ("running", pa.int32()),
    ("waiting", pa.int32()),
    ("kv_cache_usage", pa.float64()),
    ("prompt_tokens", pa.int32()),
    ("generation_tokens", pa.int32()),
    ("prefix_cache_queries", pa.int64()),
    ("prefix_cache_hits", pa.int64()),
    # NIXL telemetry of the KV transfers this worker initiated that completed in this step (the
    # prefill worker in push mode, the decode worker in pull mode), one entry per transfer:
    # post = seconds spent posting it, transfer = seconds from post to completion, bytes moved.
    ("kv_post_s", pa.list_(pa.float64())),
    ("kv_transfer_s", pa.list_(pa.float64())),
    ("kv_transfer_bytes", pa.list_(pa.int64())),
    ("kv_transfer_descriptors", pa.list_(pa.int64())),
    # offload=dram, prefill worker: per completed write, seconds from the prefill request
    # finishing to its KV blocks being released to vLLM (waiting to post + transfer).
    ("kv_held_s", pa.list_(pa.float64())),
    # offload=dram, prefill worker: per request whose blocks vLLM freed (at the end of the step
    # in which the write completed), seconds from the prefill request finishing to that.
    ("kv_freed_s", pa.list_(pa.float64())),
    # offload=dram, decode worker: per load from the DRAM tier in the step, the tokens it brought,
    # the tokens the engine then computed itself (the last prompt token, plus the generated ones
    # after a preemption), and 1 if the request came back after a preemption.
    ("kv_load_tokens", pa.list_(pa.int64())),
    ("kv_load_recompute_tokens", pa.list_(pa.int64())),
    ("kv_load_after_preemption", pa.list_(pa.int32())),
    # prompt tokens the engine computed itself in the step (vLLM's PromptTokenStats.computed:
    # neither prefix-cached nor received), and requests it preempted in the step.
    ("prompt_tokens_computed", pa.int32()),
    ("preempted", pa.int32()),
])

FLUSH_EVERY_S = 30.0


def _write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    tmp.rename(path)


def write_request_metrics(run_path: Path, shard: str, records: list[dict[str, Any]]) -> None:
    """Append ``records`` (dicts with the :data:`REQUEST_SCHEMA` columns) as one new part file
    of ``shard``'s request metrics. Written under a temporary name and renamed."""
    if not records:
        return
    table = pa.Table.from_pylist(records, schema=REQUEST_SCHEMA)
    _write(table, Path(run_path) / "metrics" / "requests" / shard / f"part-{uuid.uuid4().hex}.parquet")


def read_request_metrics(run_path: Path) -> pa.Table:
    """Every request metrics row of a run (an empty table with the schema when there is none)."""
    parts = sorted((Path(run_path) / "metrics" / "requests").glob("*/part-*.parquet"))
    if not parts:
        return REQUEST_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(p, schema=REQUEST_SCHEMA) for p in parts])


def read_worker_metrics(run_path: Path) -> pa.Table:
    """Every worker step row of a run (an empty table with the schema when there is none)."""
    parts = sorted((Path(run_path) / "metrics" / "workers").glob("*.parquet"))
    if not parts:
        return WORKER_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(p, schema=WORKER_SCHEMA) for p in parts])


class StepRecorder:
    """Collects one :data:`WORKER_SCHEMA` row per engine step from vLLM's scheduler and iteration
    stats (a ``StatLoggerBase`` made by :func:`step_recorder_factory`), and writes them to
    ``RUN_DIR/metrics/workers/<worker>.<pid>.<part>.parquet``, one new part per flush.

    Cost: one tuple appended per engine step, ~1 us (measured; steps take milliseconds), and a
    Parquet part per ``FLUSH_EVERY_S`` seconds; memory holds only the steps since the last flush.
    """

    def __init__(self, run_path: Path, worker: str, role: str):
        import os

        self.directory = Path(run_path) / "metrics" / "workers"
        self.stem = f"{worker}.{os.getpid()}"
        self.parts = 0
        self.worker, self.role = worker, role
        self.rows: list[tuple] = []
        self.flushed_at = time.monotonic()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is None and iteration_stats is None:
            return
        s, it = scheduler_stats, iteration_stats
        row = {
            "t": time.time(),
            "running": s.num_running_reqs if s is not None else None,
            "waiting": s.num_waiting_reqs + s.num_skipped_waiting_reqs if s is not None else None,
            "kv_cache_usage": s.kv_cache_usage if s is not None else None,
            "prompt_tokens": it.num_prompt_tokens if it is not None else 0,
            "generation_tokens": it.num_generation_tokens if it is not None else 0,
            "prefix_cache_queries": s.prefix_cache_stats.queries if s is not None and s.prefix_cache_stats else 0,
            "prefix_cache_hits": s.prefix_cache_stats.hits if s is not None and s.prefix_cache_stats else 0,
            "prompt_tokens_computed": it.prompt_token_stats.computed if it is not None else 0,
            "preempted": it.num_preempted_reqs if it is not None else 0,
        }
        data = getattr(s, "kv_connector_stats", None) or {}
        for column, key in KV_STAT_COLUMNS.items():
            row[column] = list(data[key]) if data.get(key) else None
        self.rows.append(row)
        if time.monotonic() - self.flushed_at > FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        self.flushed_at = time.monotonic()
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        for r in rows:
            r["worker"], r["role"] = self.worker, self.role
        try:
            _write(pa.Table.from_pylist(rows, schema=WORKER_SCHEMA),
                   self.directory / f"{self.stem}.{self.parts:05d}.parquet")
            self.parts += 1
        except OSError:  # metrics must never take a worker down
            pass


#: Worker-metrics list columns <- keys of the step's ``SchedulerStats.kv_connector_stats`` (the
#: NIXL connector's ``NixlKVConnectorStats.data`` has the first four; the DRAM tier's
#: :class:`pipeline.kv.dram_connector.DramTierStats` has them all), one entry per event.
KV_STAT_COLUMNS = {
    "kv_post_s": "post_duration",
    "kv_transfer_s": "transfer_duration",
    "kv_transfer_bytes": "bytes_transferred",
    "kv_transfer_descriptors": "num_descriptors",
    "kv_held_s": "held_after_prefill",
    "kv_freed_s": "freed_after_prefill",
    "kv_load_tokens": "load_tokens",
    "kv_load_recompute_tokens": "load_recompute_tokens",
    "kv_load_after_preemption": "load_after_preemption",
}


def step_recorder_factory(recorder: StepRecorder):
    """A vLLM ``StatLoggerFactory`` (``(vllm_config, engine_index) -> StatLoggerBase``) whose
    loggers feed ``recorder``; pass it in ``AsyncLLM.from_engine_args(stat_loggers=[...])``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            recorder.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Logger
