"""The output shard: one row per input row, in input order.

Columns (documented in the README):
  id                 the input's id column, or "<shard name>:<row index>" when it has none
  <passthrough>      every input column except the id and text columns, unchanged
  generation         string, null on error
  generation_token_ids  list<int32>, the output token ids
  finish_reason      "stop" | "length" | null on error
  prompt_tokens      int32, tokens in the rendered prompt (null when it could not be rendered)
  prompt_truncated   bool, the text was cut to fit the context (job.too_long=truncate)
  output_tokens      int32
  error              string, null when the row is fine; otherwise why it failed
  queue_s            seconds from the shard being read to the row entering prefill
  prefill_s          seconds of prefill (to the prefill worker's first token / KV ready)
  kv_handoff_s       seconds from prefill finished to the decode worker's first token
                     (hand-off message + NIXL transfer + scheduling); null when colocated
  ttft_s             seconds from entering prefill to the first output token
  decode_s           seconds from the first to the last output token
  kv_tokens          prompt tokens whose KV the decode worker received instead of computing
  kv_bytes           kv_tokens x KV bytes per token of the model
  prefill_worker     worker id ("prefill-0@host", "colocated-0@host")
  decode_worker      worker id ("decode-0@host"); null when colocated
  passage_ids        RAG jobs only: list<string>, the retrieved passages ("<doc id>#<chunk>"),
                     best first, numbered [1], [2], ... in the prompt
  passage_scores     RAG jobs only: list<float32>, their cosine similarity to the question
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass
class RowResult:
    """Everything the output shard records about one row beyond its input columns."""

    generation: str | None = None
    generation_token_ids: list[int] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    prompt_truncated: bool = False
    output_tokens: int = 0
    error: str | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    kv_handoff_s: float | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    kv_tokens: int = 0
    kv_bytes: int = 0
    prefill_worker: str | None = None
    decode_worker: str | None = None
    passage_ids: list[str] | None = None
    passage_scores: list[float] | None = None
    # Not an output column: this row's request metrics (pipeline.metrics.REQUEST_SCHEMA columns
    # known to the worker that served it), written to the run directory by the shard's owner.
    metrics: dict | None = None


RESULT_SCHEMA = pa.schema([
    ("generation", pa.string()),
    ("generation_token_ids", pa.list_(pa.int32())),
    ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("prompt_truncated", pa.bool_()),
    ("output_tokens", pa.int32()),
    ("error", pa.string()),
    ("queue_s", pa.float64()),
    ("prefill_s", pa.float64()),
    ("kv_handoff_s", pa.float64()),
    ("ttft_s", pa.float64()),
    ("decode_s", pa.float64()),
    ("kv_tokens", pa.int64()),
    ("kv_bytes", pa.int64()),
    ("prefill_worker", pa.string()),
    ("decode_worker", pa.string()),
    ("passage_ids", pa.list_(pa.string())),
    ("passage_scores", pa.list_(pa.float32())),
])
RAG_COLUMNS = ("passage_ids", "passage_scores")
assert [f.name for f in fields(RowResult) if f.name != "metrics"] == RESULT_SCHEMA.names


def row_ids(table: pa.Table, id_column: str, shard_name: str) -> pa.Array:
    """The id column, or ``"<shard name>:<row index>"`` strings when the input has none."""
    if id_column in table.column_names:
        return table.column(id_column).combine_chunks()
    return pa.array([f"{shard_name}:{i}" for i in range(table.num_rows)], pa.string())


def build_output(table: pa.Table, ids: pa.Array, id_column: str, text_column: str,
                 results: list[RowResult], rag: bool = False) -> pa.Table:
    """Assemble the output shard: ``id_column``, passthrough columns, then the result columns
    (the RAG columns only when ``rag``).

    Raises:
        ValueError: ``results`` does not hold exactly one entry per input row, or an input
            column has the name of a result column.
    """
    if len(results) != table.num_rows:
        raise ValueError(f"{len(results)} results for {table.num_rows} input rows")
    columns = {id_column: ids}
    for name in table.column_names:
        if name in (id_column, text_column):
            continue
        if name in RESULT_SCHEMA.names:
            raise ValueError(f"input column {name!r} clashes with an output column; rename it")
        columns[name] = table.column(name)
    for field in RESULT_SCHEMA:
        if field.name in RAG_COLUMNS and not rag:
            continue
        columns[field.name] = pa.array([getattr(r, field.name) for r in results], field.type)
    return pa.table(columns)


class RowCheckpoint:
    """Results of finished rows of one shard, saved in batches so a restarted owner (killed,
    preempted, requeued) resumes inside the shard instead of from its start.

    Each batch of ``every`` finished rows becomes one Parquet file in ``directory`` (a row index
    column plus the result columns), written under a temporary name and renamed. Rows still in
    flight when the owner dies are served again. ``with_batch``, when given, receives the
    ``extra`` records of each batch's rows right after that batch is saved (the owner writes its
    request metrics there): a row's metrics are written once its result is safe, so a resumed
    shard never serves a row again that already has metrics.
    """

    def __init__(self, directory: Path, every: int,
                 with_batch: Callable[[list[dict[str, Any]]], None] | None = None):
        self.directory, self.every = Path(directory), max(1, every)
        self.with_batch = with_batch
        self.pending: list[tuple[int, RowResult, dict[str, Any] | None]] = []

    def load(self) -> dict[int, RowResult]:
        """Finished rows saved by earlier attempts, by row index."""
        out: dict[int, RowResult] = {}
        for part in sorted(self.directory.glob("part-*.parquet")):
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
        self.directory.mkdir(parents=True, exist_ok=True)
        cols = {"row": pa.array([r for r, _, _ in batch], pa.int64())}
        for f in RESULT_SCHEMA:
            cols[f.name] = pa.array([getattr(res, f.name) for _, res, _ in batch], f.type)
        name = f"part-{uuid.uuid4().hex}.parquet"
        tmp = self.directory / f".{name}.tmp"
        pq.write_table(pa.table(cols), tmp)
        tmp.rename(self.directory / name)
        extras = [e for _, _, e in batch if e is not None]
        if self.with_batch is not None and extras:
            self.with_batch(extras)

    def clear(self) -> None:
        """Drop the checkpoints once the output shard is in place."""
        shutil.rmtree(self.directory, ignore_errors=True)
