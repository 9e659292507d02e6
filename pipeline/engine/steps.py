"""Per-step engine metrics: :class:`StepRecorder` receives vLLM's scheduler and iteration stats
after every engine step and writes them as :data:`pipeline.io.metrics.WORKER_SCHEMA` rows."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.io.atomic import write_parquet
from pipeline.io.metrics import WORKER_SCHEMA

FLUSH_EVERY_S = 30.0


#: Worker-metrics list columns <- keys of the step's ``SchedulerStats.kv_connector_stats`` (the
#: NIXL connector's ``NixlKVConnectorStats.data`` has the first four; the DRAM tier's
#: :class:`pipeline.engine.dram_connector.DramTierStats` has them all), one entry per event.
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


class StepRecorder:
    """Collects one :data:`WORKER_SCHEMA` row per engine step from vLLM's scheduler and iteration
    stats (a ``StatLoggerBase`` made by :func:`step_recorder_factory`), and writes them to
    ``RUN_DIR/metrics/workers/<worker>.<pid>.<part>.parquet``, one new part per flush.

    Cost: one tuple appended per engine step, ~1 us (measured; steps take milliseconds), and a
    Parquet part per ``FLUSH_EVERY_S`` seconds; memory holds only the steps since the last flush.
    """

    def __init__(self, run_path: Path, worker: str, role: str):
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
            write_parquet(pa.Table.from_pylist(rows, schema=WORKER_SCHEMA),
                   self.directory / f"{self.stem}.{self.parts:05d}.parquet")
            self.parts += 1
        except OSError:  # metrics must never take a worker down
            pass


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
