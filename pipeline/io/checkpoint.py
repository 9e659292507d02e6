"""Row checkpoints: finished rows of a shard saved in batches, so that a restarted shard owner
resumes inside the shard instead of from its start."""

from __future__ import annotations

import asyncio
import shutil
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

    Each batch of ``every`` finished rows becomes one Parquet file in ``directory`` (a row index
    column plus the result columns), written under a temporary name and renamed. Rows still in
    flight when the owner dies are served again. ``with_batch``, when given, receives the
    ``extra`` records of each batch's rows right after that batch is saved (the owner writes its
    request metrics there): a row's metrics are written once its result is safe, so a resumed
    shard never serves a row again that already has metrics. ``samples``: the sample columns are
    lists (``job.sampling.n`` > 1, :func:`~pipeline.io.output.result_schema`).
    """

    def __init__(self, directory: Path, every: int,
                 with_batch: Callable[[list[dict[str, Any]]], None] | None = None, samples: bool = False):
        self.directory, self.every = Path(directory), max(1, every)
        self.schema = result_schema(samples)
        self.with_batch = with_batch
        self.pending: list[tuple[int, RowResult, dict[str, Any] | None]] = []

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
        when ``every`` rows are pending."""
        self.pending.append((row, result, extra))
        if len(self.pending) >= self.every:
            await self.flush()

    async def flush(self) -> None:
        """Save the pending rows now (the shard's last, partial batch)."""
        batch, self.pending = self.pending, []
        if batch:
            await asyncio.to_thread(self._write, batch)

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
