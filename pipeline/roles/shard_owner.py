"""Shard ownership, shared by prefill and colocated workers: stream a shard's rows (or one work
unit's, a row range of a split shard: :mod:`pipeline.io.units`), turn them into prompts, serve
each prompt (at most ``job.batch_rows`` in flight per worker), write the output shard (or the
unit's part) incrementally and atomically, and mark the shard (or part) done. The owner is the
only writer of its output; a split shard's output is assembled from its parts by one worker
(:func:`finish_split`). Which worker serves what is :mod:`pipeline.roles.work`'s."""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from pipeline.config import Config, SamplingConfig
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.engine.lora import row_adapters
from pipeline.io.atomic import atomic_write
from pipeline.io.checkpoint import RowCheckpoint
from pipeline.io.formats import LINE_ERROR, line_errors
from pipeline.io.metrics import request_record, write_request_metrics
from pipeline.io.openai_batch import REQUEST_SAMPLING, body_errors, is_request_batch, request_prompts
from pipeline.io.openai_output import write_batch_output
from pipeline.io.output import RowResult, build_output, output_schema, row_ids
from pipeline.io.prompts import Prompt, make_prompts
from pipeline.io.sampling import row_sampling
from pipeline.io.units import Unit, assemble, part_done, part_file, parts_done
from pipeline.io.shards import (Shard, batch_output_url, duplicate_id_rows, iter_batches, output_url, shard_schema,
                                 text_values)
from pipeline.roles.errors import is_worker_failure
from pipeline.roles.recompute import add_counts, kv_counts
from pipeline.runtime.ids import row_key
from pipeline.runtime.rundir import RunDir

ServeRow = Callable[[Prompt], Awaitable[RowResult]]


class Progress:
    """Rows and output tokens this worker has finished, published to the run directory at most
    once a second (the launcher's progress bar reads it), and of those rows the ones it handed
    off to a decode rank (``handed_off``) and those it served alone in its own engine
    (``alone``; ``python -m pipeline.status`` shows both for a disaggregated worker)."""

    def __init__(self, run: RunDir, worker: str):
        self.run, self.worker = run, worker
        self.data = {"worker": worker, "rows": 0, "output_tokens": 0, "shards": 0, "handed_off": 0, "alone": 0}
        self._last = 0.0

    def add(self, rows: int = 0, output_tokens: int = 0, shards: int = 0, force: bool = False,
            handed_off: int = 0, alone: int = 0) -> None:
        self.data["rows"] += rows
        self.data["handed_off"] += handed_off
        self.data["alone"] += alone
        self.data["output_tokens"] += output_tokens
        self.data["shards"] += shards
        now = time.monotonic()
        if force or now - self._last >= 1.0:
            self._last = now
            self.run.write_progress(self.worker, self.data)


READ_ROWS = 1024  # rows read from a shard at a time (one Parquet record batch)
AHEAD_BATCHES = 2  # record batches read ahead of the oldest one not yet written


class _Batch:
    """One record batch of a shard in flight: its rows' tasks, written once all have ended."""

    def __init__(self, first_row: int, rows: pa.RecordBatch, ids: pa.Array, read_at: float):
        self.first_row, self.rows, self.ids, self.read_at = first_row, rows, ids, read_at
        self.tasks: dict[int, asyncio.Task] = {}


class ShardOwner:
    """One shard, end to end, in bounded memory: its rows are read ``READ_ROWS`` at a time,
    served (each holding one of the worker's ``slots`` while it is served), and written in input
    order to one output file, incrementally (a Parquet writer on a temporary name, moved into
    place when the shard is complete: one atomic output per shard). At most ``AHEAD_BATCHES``
    record batches wait behind the oldest unwritten one. Finished rows are also saved in row
    checkpoints (``job.checkpoint_rows`` or more at a time, at most one save per
    ``job.checkpoint_interval_s``), from which a restarted owner resumes.
    ``dispatched`` is set once every row has started (or the shard failed).

    With a split ``unit``, only its row groups are read and they go to its part
    (``RUN_DIR/parts/<shard>/part-K.parquet``); the part is marked written, and when every part
    is, the owner that wins the shard's ``assembly`` claim assembles the output shard.
    ``still_mine``: whether this worker still holds the unit (false: taken over; nothing is
    marked)."""

    def __init__(self, run: RunDir, cfg: Config, shard: Shard, worker: str, tokenizer: Any,
                 serve: ServeRow, slots: asyncio.Semaphore, progress: Progress,
                 still_mine: Callable[[], bool] = lambda: True, unit: Unit | None = None,
                 assembly: Callable[[], bool] = lambda: True):
        self.still_mine, self.assembly = still_mine, assembly
        self.unit = unit or Unit(shard.index)
        self.run, self.cfg, self.job, self.shard, self.worker = run, cfg, cfg.job, shard, worker
        self.tokenizer, self.serve, self.slots, self.progress = tokenizer, serve, slots, progress
        self.dispatched = asyncio.Event()
        self.queue: asyncio.Queue[_Batch | None] = asyncio.Queue(maxsize=AHEAD_BATCHES)
        # Request metrics are written with each checkpoint batch, once their rows' results are saved.
        self.samples = run.sample_lists()  # the sample columns are lists
        self.checkpoint = RowCheckpoint(run.parts_dir(shard) / f"checkpoints-{self.unit.part:05d}" if self.unit.split
                                        else run.checkpoint_dir(shard), cfg.job.checkpoint_rows,
                                        with_batch=lambda records: write_request_metrics(run.path, shard.name, records),
                                        samples=self.samples, interval_s=cfg.job.checkpoint_interval_s)
        self.resumed: dict[int, RowResult] = {}
        self.row_tasks: set[asyncio.Task] = set()
        # decode_kv: did the KV move (pipeline.roles.recompute.kv_counts), summed by the run's summary
        self.totals = {"rows": 0, "errors": 0, "prompt_tokens": 0, "output_tokens": 0, "kv_bytes": 0,
                       "decode_kv": add_counts(None, None), "decode_rank_rows": 0,
                       "prefill_local_rows": 0}

    async def own(self) -> None:
        """Serve and write the shard, then mark it done (or failed, if it cannot be read or
        written).

        Raises:
            Exception: a worker failure (:func:`~pipeline.roles.errors.is_worker_failure`).
        """
        started = time.time()
        writer = asyncio.create_task(self._write_all())
        try:
            await self._dispatch(writer)
            await writer
        except Exception as exc:  # a bad shard must not stop the others
            writer.cancel()
            self.checkpoint.cancel()
            for t in self.row_tasks:
                t.cancel()
            if is_worker_failure(exc):
                raise
            self.run.mark_failed(self.shard, f"{type(exc).__name__}: {exc}", self.worker)
            return
        finally:
            self.dispatched.set()
        if not self.still_mine():  # taken over while this worker was silent: the new holder marks it
            return
        self.checkpoint.clear()
        totals = {**self.totals, "worker": self.worker, "resumed_rows": len(self.resumed), "started_at": started,
                  "finished_at": time.time()}
        if not self.unit.split:
            self.run.mark_done(self.shard, {"shard": self.shard.name, **totals})
            self.progress.add(shards=1, force=True)
            return
        part_done(self.run.parts_dir(self.shard), self.unit, totals)
        if parts_done(self.run.parts_dir(self.shard), self.unit.parts) and self.assembly():
            await asyncio.to_thread(finish_split, self.run, self.shard, self.unit.parts, self.tokenizer,
                                    self.worker, self.progress)

    async def _dispatch(self, writer: asyncio.Task) -> None:
        """Read the shard batch by batch and start its rows; returns when every row started."""
        self.resumed = await asyncio.to_thread(self.checkpoint.load)
        self.progress.add(rows=len(self.resumed), output_tokens=sum(r.output_tokens for r in self.resumed.values()))
        duplicates = await asyncio.to_thread(duplicate_id_rows, self.shard, self.job.id_column)
        u = self.unit
        batches = iter_batches(self.shard, READ_ROWS, row_groups=(u.first_group, u.groups) if u.split else None,
                               first_row=u.first_row)
        try:
            while (item := await asyncio.to_thread(next, batches, None)) is not None:
                first_row, rows = item
                batch = _Batch(first_row, rows, row_ids(rows, self.job.id_column, self.shard.name, first_row), time.time())
                async for ready in self._prompts(batch, duplicates):
                    for p in ready:
                        if p.row not in self.resumed and p.error is None:
                            await self.slots.acquire()  # released when the row has been served
                        task = batch.tasks[p.row] = asyncio.create_task(self._one(p, batch.read_at))
                        self.row_tasks.add(task)
                        task.add_done_callback(self.row_tasks.discard)
                await self._put(batch, writer)
        finally:
            batches.close()
        await self._put(None, writer)
        self.dispatched.set()

    async def _put(self, batch: _Batch | None, writer: asyncio.Task) -> None:
        """Queue ``batch`` for the writer, waiting while ``AHEAD_BATCHES`` are queued; raises
        the writer's exception if it failed meanwhile."""
        put = asyncio.ensure_future(self.queue.put(batch))
        await asyncio.wait({put, writer}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            writer.result()

    async def _prompts(self, batch: _Batch, duplicates: dict[int, str]) -> AsyncIterator[list[Prompt]]:
        """The batch's rows as prompts, in groups ready to serve: rows resumed from a checkpoint
        first, then the rest (RAG: as their passages are retrieved, so prefill overlaps retrieval)."""
        names = batch.rows.schema.names
        n = batch.rows.num_rows
        keys = [row_key(self.shard.index, batch.first_row + i) for i in range(n)]
        column = self.job.prompt_column
        errors = line_errors(batch.rows, batch.first_row, duplicates)  # JSON Lines / CSV lines that did not parse
        requests = is_request_batch(batch.rows.schema)
        if requests:  # OpenAI batch requests, whatever the job's columns
            prompts = await asyncio.to_thread(request_prompts, batch.rows, keys, self.job, self.tokenizer,
                                              self.cfg.model.max_model_len, batch.first_row, errors,
                                              self._samplings(batch.rows, REQUEST_SAMPLING, "body"))
        elif column not in names:  # refused at start; a shard replaced since still fails row by row
            missing = (f"column {column!r} is not in the shard (columns: {', '.join(names)}); "
                       f"set job.{'messages' if self.job.messages_column else 'text'}_column")
            yield [Prompt(row=batch.first_row + i, row_key=k, error=errors.get(batch.first_row + i) or missing)
                   for i, k in enumerate(keys)]
            return
        else:
            texts = text_values(batch.rows, column)
            prompts = await asyncio.to_thread(make_prompts, texts, keys, self.job, self.tokenizer,
                                              self.cfg.model.max_model_len, first_row=batch.first_row,
                                              row_errors=errors, samplings=self._samplings(batch.rows))
        self._adapters(batch.rows, prompts)
        yield [p for p in prompts if p.row in self.resumed]
        todo = [p for p in prompts if p.row not in self.resumed]
        if self.job.rag is None or not todo or requests:
            yield todo
            return
        from pipeline.rag.job import rag_prompt_batches

        async for ready in rag_prompt_batches(todo, {batch.first_row + i: t for i, t in enumerate(texts)},
                                              self.cfg, self.tokenizer):
            yield ready

    def _adapters(self, rows: pa.RecordBatch, prompts: list[Prompt]) -> None:
        """Set each prompt's LoRA adapter from ``job.lora_column`` (absent: the base model for
        all); a value that names no adapter of ``model.lora`` makes its row an error."""
        column = self.job.lora_column
        if column not in rows.schema.names:
            return
        for p, (name, why) in zip(prompts, row_adapters(rows.column(column).to_pylist(), column, self.cfg.model.lora)):
            if p.error is None:
                p.lora, p.error = name, why

    def _samplings(self, rows: pa.RecordBatch, column: str | None = None,
                   label: str | None = None) -> list[SamplingConfig | str | None] | None:
        """Each row's own sampling from ``column`` (default ``job.sampling_column``; None: the
        column is absent), or why it is invalid (the row's error, naming the field as
        ``label.field``: ``body`` for an OpenAI batch request, in its own names)."""
        column = column or self.job.sampling_column
        if column not in rows.schema.names:
            return None
        out: list[SamplingConfig | str | None] = []
        for value in rows.column(column).to_pylist():
            if value is not None and not isinstance(value, dict):
                out.append(f"{column} is {type(value).__name__}, not a struct of sampling fields")
                continue
            try:
                out.append(row_sampling(self.job.sampling, value, label or column, self.samples))
            except ValueError as exc:
                out.append(body_errors(str(exc)) if label == "body" else str(exc))
        return out

    async def _one(self, p: Prompt, read_at: float) -> RowResult:
        if p.row in self.resumed:
            return self.resumed[p.row]
        if p.error is not None:
            result = RowResult(error=p.error, prefill_worker=self.worker, served=False)
        else:
            t0 = time.time()
            try:
                result = await self.serve(p)
            except Exception as exc:  # one row's failure must not take the shard down
                if is_worker_failure(exc):
                    raise
                result = RowResult(error=f"{type(exc).__name__}: {exc}", prefill_worker=self.worker,
                                   prefill_start=t0)
            finally:
                self.slots.release()
            result.queue_s = t0 - read_at
            result.prompt_tokens = len(p.token_ids)
            result.prompt_truncated = p.truncated
            result.passage_ids, result.passage_scores = p.passage_ids, p.passage_scores
        self.progress.add(rows=1, output_tokens=result.output_tokens, handed_off=int(result.decode_worker is not None),
                          alone=int(result.decode_worker is None and result.error is None))
        record = (request_record(result, key=p.row_key, shard=self.shard.name, row=p.row, read_at=read_at)
                  if result.served else None)
        await self.checkpoint.add(p.row, result, record)
        return result

    async def _write_all(self) -> None:
        """Write each queued batch, in order, once all its rows ended; the output appears under
        its name only when the whole shard is written."""
        job = self.job
        rag = job.rag is not None
        input_schema = await asyncio.to_thread(shard_schema, self.shard)
        batch_file = is_request_batch(input_schema)
        if LINE_ERROR in input_schema.names:  # JSON Lines / CSV: a bad line's why is in the error column
            input_schema = input_schema.remove(input_schema.get_field_index(LINE_ERROR))
        schema = output_schema(input_schema, job.id_column, job.prompt_column, rag, job.input_column_prefix,
                               self.samples)
        url = (str(part_file(self.run.parts_dir(self.shard), self.unit.part, ".parquet")) if self.unit.split
               else output_url(self.run.output_dir(), self.shard))
        pending: list[asyncio.Task] = []
        with atomic_write(url) as f:
            writer = pq.ParquetWriter(f, schema)
            try:
                while (batch := await self.queue.get()) is not None:
                    # In row order: rows start resumed-first, and RAG rows sorted by their passages.
                    pending = [batch.tasks[row] for row in sorted(batch.tasks)]
                    try:
                        results = await asyncio.gather(*pending)
                    finally:
                        for t in pending:
                            t.cancel()
                    rows = batch.rows.select(input_schema.names)
                    table = build_output(rows, batch.ids, job.id_column, job.prompt_column, results,
                                         rag=rag, prefix=job.input_column_prefix, samples=self.samples)
                    await asyncio.to_thread(writer.write_table, table.cast(schema))
                    self._count(results)
                await self.checkpoint.flush()  # the last rows' metrics
            finally:
                writer.close()
        if batch_file and not self.unit.split:  # an OpenAI batch file: its output lines too, from the shard
            await asyncio.to_thread(write_batch_output, url, batch_output_url(self.run.output_dir(), self.shard),
                                    self.tokenizer)

    def _count(self, results: list[RowResult]) -> None:
        t = self.totals
        t["rows"] += len(results)
        t["errors"] += sum(r.error is not None for r in results)
        t["prompt_tokens"] += sum(r.prompt_tokens or 0 for r in results)
        t["output_tokens"] += sum(r.output_tokens for r in results)
        t["kv_bytes"] += sum(r.kv_bytes for r in results)
        if self.worker.startswith("decode-"):  # an elastic decode rank's unit (pools.elastic)
            t["decode_rank_rows"] += len(results)
        elif self.worker.startswith("prefill-"):  # rows a prefill worker served alone (pools.elastic)
            t["prefill_local_rows"] += sum(r.decode_worker is None and r.error is None for r in results)
        t["decode_kv"] = add_counts(t["decode_kv"], kv_counts(
            (r.decode_worker, r.error, r.prompt_tokens, r.kv_tokens, r.kv_handoff_s is not None) for r in results))


def finish_split(run: RunDir, shard: Shard, parts: int, tokenizer: Any, worker: str,
                 progress: Progress | None = None) -> None:
    """Assemble split ``shard``'s output from its ``parts`` (all written), in row order, write an
    OpenAI batch file's output lines from it, mark the shard done with the parts' totals summed,
    and remove the parts. The caller holds the shard's assembly claim."""
    folder = run.parts_dir(shard)
    totals = parts_done(folder, parts)
    if totals is None or shard.name in run.done():
        return
    url = output_url(run.output_dir(), shard)
    assemble(folder, parts, url)
    if is_request_batch(shard_schema(shard)):
        write_batch_output(url, batch_output_url(run.output_dir(), shard), tokenizer)
    summed = {k: sum(t[k] for t in totals) for k in ("rows", "errors", "prompt_tokens", "output_tokens", "kv_bytes",
                                                      "resumed_rows")}
    run.mark_done(shard, {"shard": shard.name, **summed, "worker": worker,
                          "decode_kv": functools.reduce(add_counts, (t.get("decode_kv") for t in totals), None),
                          "decode_rank_rows": sum(t.get("decode_rank_rows", 0) for t in totals),
                          "prefill_local_rows": sum(t.get("prefill_local_rows", 0) for t in totals),
                          "parts": [{k: t[k] for k in ("worker", "rows", "started_at", "finished_at")} for t in totals],
                          "started_at": min(t["started_at"] for t in totals), "finished_at": time.time()})
    shutil.rmtree(folder, ignore_errors=True)
    if progress is not None:
        progress.add(shards=1, force=True)
