"""Row checkpoints: finished rows of a shard saved in batches, so that a restarted shard owner
resumes inside the shard instead of from its start."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.atomic import write_parquet
from pipeline.io.output import RowResult, result_schema
from pipeline.io.shards import run_files


class RowCheckpoint:
    """Results of finished rows of one shard, saved in batches so a restarted owner (killed,
    preempted, requeued) resumes inside the shard instead of from its start.

    Each batch of at least ``every`` finished rows becomes one Parquet file in ``directory`` (a
    row index column plus the result columns), written under a temporary name and renamed, at
    most once per ``interval_s`` seconds: rows that finish sooner join the next batch, saved
    ``interval_s`` after the last one whether or not more rows finish. Rows still in flight
    when the owner dies, and finished rows not yet saved (at most ``interval_s`` worth), are
    served again. The interval bounds what checkpoints cost a fast shard (two Parquet files
    per batch, ~0.8 ms of CPU a row at 4 rows a batch on a 2-core machine: BENCHMARKS.md, "A
    shard owner's row checkpoints"); 0 saves every ``every`` rows. ``with_batch``, when given, receives the
    ``extra`` records of each batch's rows right after that batch is saved (the owner writes its
    request metrics there): a row's metrics are written once its result is safe, so a resumed
    shard never serves a row again that already has metrics. ``samples``: the sample columns are
    lists (``job.sampling.n`` > 1, :func:`~pipeline.io.output.result_schema`).
    """

    def __init__(self, directory: Path, every: int,
                 with_batch: Callable[[list[dict[str, Any]]], None] | None = None, samples: bool = False,
                 interval_s: float = 0.0):
        self.directory, self.every = Path(directory), max(1, every)
        self.interval_s = max(0.0, interval_s)
        self.schema = result_schema(samples)
        self.with_batch = with_batch
        self.pending: list[tuple[int, RowResult, dict[str, Any] | None]] = []
        self.saved_at = float("-inf")  # time.monotonic() of the last batch saved
        self._timer: asyncio.TimerHandle | None = None  # the deferred save of a full batch
        self._saving: set[asyncio.Task] = set()  # deferred saves under way

    def load(self) -> dict[int, RowResult]:
        """Finished rows saved by earlier attempts, by row index."""
        out: dict[int, RowResult] = {}
        for part in run_files(self.directory, "part-*.parquet"):
            for rec in pq.read_table(part).to_pylist():
                row = rec.pop("row")
                out[row] = RowResult(**rec)
        return out

    async def add(self, row: int, result: RowResult, extra: dict[str, Any] | None = None) -> None:
        """Record a finished row (and its ``extra`` record for ``with_batch``); save a batch
        when ``every`` rows are pending, now if the last save is ``interval_s`` old, else
        when it is."""
        self.pending.append((row, result, extra))
        if len(self.pending) < self.every or self._timer is not None:
            return
        wait = self.saved_at + self.interval_s - time.monotonic()
        if wait <= 0:
            await self._save()
        else:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)

    def _due(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._save())
        self._saving.add(task)
        task.add_done_callback(self._saving.discard)

    async def _save(self) -> None:
        batch, self.pending = self.pending, []
        if batch:
            self.saved_at = time.monotonic()
            await asyncio.to_thread(self._write, batch)

    async def flush(self) -> None:
        """Save the pending rows now (the shard's last, partial batch), after any deferred save
        under way.

        Raises:
            OSError: a batch could not be written (a deferred one's error is raised here).
        """
        self.cancel()
        await self._save()
        if self._saving:
            await asyncio.gather(*list(self._saving))

    def cancel(self) -> None:
        """Drop the deferred save (the shard failed: its pending rows are served again)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _write(self, batch: list[tuple[int, RowResult, dict[str, Any] | None]]) -> None:
        cols = {"row": pa.array([r for r, _, _ in batch], pa.int64())}
        for f in self.schema:
            cols[f.name] = pa.array([getattr(res, f.name) for _, res, _ in batch], f.type)
        write_parquet(pa.table(cols), self.directory / f"part-{uuid.uuid4().hex}.parquet")
        extras = [e for _, _, e in batch if e is not None]
        if self.with_batch is not None and extras:
            self.with_batch(extras)

    def clear(self) -> None:
        """Drop the checkpoints once the output shard is in place."""
        shutil.rmtree(self.directory, ignore_errors=True)
