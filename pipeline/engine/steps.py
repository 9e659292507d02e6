"""Per-step engine metrics: :class:`StepRecorder` receives vLLM's scheduler and iteration stats
after every engine step and writes them as :data:`pipeline.io.metrics.WORKER_SCHEMA` rows."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.atomic import write_parquet
from pipeline.io.metrics import WORKER_SCHEMA, worker_part_path

FLUSH_EVERY_S = 30.0
#: Parts (and merged files) of one level merged into one file of the next: a worker running for
#: hours keeps about MERGE_PARTS files a level (10 h: 1,200 parts, 2 levels), not one a flush.
MERGE_PARTS = 16
#: Steps held while their part cannot be written (about 1 KB each); the oldest beyond are dropped.
HELD_STEPS_MAX = 20_000
#: Seconds between two warnings while the parts cannot be written.
WARN_EVERY_S = 600.0

log = logging.getLogger(__name__)


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
    ``RUN_DIR/metrics/workers/<worker>.<pid>.<part>.parquet``, one new part per flush, every
    :data:`MERGE_PARTS` of them (and of their merged files, level by level) merged into one.

    Cost: one tuple appended per engine step, ~1 us (measured; steps take milliseconds), and a
    Parquet part per ``FLUSH_EVERY_S`` seconds; memory holds only the steps since the last flush
    (while parts cannot be written, up to :data:`HELD_STEPS_MAX` of them: see :meth:`flush`).
    ``lost``: the steps dropped so far, never written.
    """

    def __init__(self, run_path: Path, worker: str, role: str):
        self.directory = Path(run_path) / "metrics" / "workers"
        self.stem = f"{worker}.{os.getpid()}"
        self.parts = 0
        self.worker, self.role = worker, role
        self.rows: list[dict] = []
        self.flushed_at = time.monotonic()
        self.lost = 0
        self.failing: str | None = None  # the last write's error while writes fail
        self.warned_at = 0.0  # time.monotonic() of the last warning about it

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
        """Write the steps held since the last part written as one new part. Never raises for a
        write that fails (``OSError``: a file system full, read-only or gone; metrics must never
        take a worker down): the steps are held for the next flush (every ``FLUSH_EVERY_S``
        seconds), at most :data:`HELD_STEPS_MAX` of them, the oldest beyond dropped and counted
        in ``lost``. The first failure is a warning naming the path and the error, repeated every
        :data:`WARN_EVERY_S` seconds while writes fail; the first write after them says so."""
        self.flushed_at = time.monotonic()
        if not self.rows:
            return
        for r in self.rows:
            r["worker"], r["role"] = self.worker, self.role
        path = self._name(self.parts, self.parts)
        try:
            write_parquet(pa.Table.from_pylist(self.rows, schema=WORKER_SCHEMA), path)
        except OSError as exc:
            self._failed(path, exc)
            return
        self.parts += 1
        self._merge()
        if self.failing is not None:
            log.warning("engine step metrics written again to %s (%d steps, held while writes failed%s)", path,
                        len(self.rows), f"; {self.lost} dropped" if self.lost else "")
            self.failing = None
        self.rows = []

    def _name(self, first: int, last: int) -> Path:
        return worker_part_path(self.directory, self.stem, first, last)

    def _merge(self) -> None:
        """After part ``parts - 1``: for each level ``L`` whose ``MERGE_PARTS ** L`` parts it
        completes, write their files as one (``<stem>.<first>-<last>.parquet``) and remove them.
        The merged file is in place before any of its parts is removed; a reader takes it in
        their place (:func:`pipeline.io.metrics.worker_metrics_files`). A merge that fails leaves
        the parts as they are (metrics must never take a worker down)."""
        size = MERGE_PARTS
        while self.parts % size == 0:
            first, last, step = self.parts - size, self.parts - 1, size // MERGE_PARTS
            sources = [self._name(a, a + step - 1) for a in range(first, last + 1, step)]
            try:
                merged = pa.concat_tables([pq.read_table(p, schema=WORKER_SCHEMA) for p in sources])
                write_parquet(merged, self._name(first, last))
                for p in sources:
                    p.unlink()
            except OSError as exc:
                log.warning("could not merge engine step metrics %s..%s: %s; left as they are",
                            sources[0].name, sources[-1].name, exc)
                return
            size *= MERGE_PARTS

    def _failed(self, path: Path, exc: OSError) -> None:
        over = len(self.rows) - HELD_STEPS_MAX
        if over > 0:
            del self.rows[:over]
            self.lost += over
        now = time.monotonic()
        if self.failing is None or now - self.warned_at >= WARN_EVERY_S:
            log.warning("could not write engine step metrics to %s: %s; holding %d steps for the next try in %g s"
                        "%s", path, exc, len(self.rows), FLUSH_EVERY_S,
                        f" ({self.lost} older steps dropped: more than {HELD_STEPS_MAX} held)" if self.lost else "")
            self.warned_at = now
        self.failing = str(exc)

    def close(self) -> None:
        """The worker's last flush (:meth:`flush`). Steps it cannot write are lost: a warning
        says how many steps were never written in all, with the directory and the last error."""
        self.flush()
        if self.rows:
            self.lost += len(self.rows)
            self.rows = []
        if self.lost:
            log.warning("%d engine steps of %s were never written to %s (%s): its step metrics miss them",
                        self.lost, self.worker, self.directory, self.failing or "held past the limit")


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
