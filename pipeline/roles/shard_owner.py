"""Shard ownership, shared by prefill and colocated workers: read a shard, turn rows into
prompts, serve each prompt (at most ``job.batch_rows`` in flight), then write the output shard
atomically and mark the shard done. The owner is the only writer of its output shard."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from pipeline.config import Config
from pipeline.io.atomic import write_parquet
from pipeline.io.checkpoint import RowCheckpoint
from pipeline.io.metrics import request_record, write_request_metrics
from pipeline.io.output import RowResult, build_output, row_ids
from pipeline.io.prompts import Prompt, make_prompts
from pipeline.io.shards import Shard, output_url, read_shard
from pipeline.roles.errors import is_worker_failure
from pipeline.runtime.ids import row_key
from pipeline.runtime.rundir import RunDir

ServeRow = Callable[[Prompt], Awaitable[RowResult]]


class Progress:
    """Rows and output tokens this worker has finished, published to the run directory at most
    once a second (the launcher's progress bar reads it)."""

    def __init__(self, run: RunDir, worker: str):
        self.run, self.worker = run, worker
        self.data = {"worker": worker, "rows": 0, "output_tokens": 0, "shards": 0}
        self._last = 0.0

    def add(self, rows: int = 0, output_tokens: int = 0, shards: int = 0, force: bool = False) -> None:
        self.data["rows"] += rows
        self.data["output_tokens"] += output_tokens
        self.data["shards"] += shards
        now = time.monotonic()
        if force or now - self._last >= 1.0:
            self._last = now
            self.run.write_progress(self.worker, self.data)


async def own_shards(run: RunDir, cfg: Config, shards: list[Shard], worker: str, tokenizer: Any,
                     serve: ServeRow, open_shards: int = 2) -> None:
    """Process ``shards``, skipping those already marked done.

    At most ``job.batch_rows`` rows are in flight across the worker, taken in shard order, and at
    most ``open_shards`` shards are open at once, so the next shard's rows start while the
    previous shard's last rows finish. A row that cannot become a prompt, or whose serving raises,
    becomes an error row: every input row gives exactly one output row, in input order. A shard
    that cannot be read or written is recorded as failed (``RUN_DIR/failed/``) and the others go on.
    """
    progress = Progress(run, worker)
    done = run.done()
    rows_limit = asyncio.Semaphore(cfg.job.batch_rows)
    open_limit = asyncio.Semaphore(open_shards)

    async def one_shard(shard: Shard) -> None:
        async with open_limit:
            try:
                totals = await _own_shard(run, cfg, shard, worker, tokenizer, serve, rows_limit, progress)
            except Exception as exc:  # a bad shard must not stop the others
                if is_worker_failure(exc):
                    raise
                run.mark_failed(shard, f"{type(exc).__name__}: {exc}", worker)
                return
            run.mark_done(shard, totals)
            progress.add(shards=1, force=True)

    await asyncio.gather(*(one_shard(s) for s in shards if s.name not in done))
    progress.add(force=True)


async def _own_shard(run: RunDir, cfg: Config, shard: Shard, worker: str, tokenizer: Any,
                     serve: ServeRow, rows_limit: asyncio.Semaphore, progress: Progress) -> dict:
    job = cfg.job
    t_read = time.time()
    table = await asyncio.to_thread(read_shard, shard)
    ids = row_ids(table, job.id_column, shard.name)
    keys = [row_key(shard.index, i) for i in range(table.num_rows)]
    texts: list = []
    if job.text_column in table.column_names:
        texts = table.column(job.text_column).to_pylist()
        prompts = make_prompts(texts, keys, job, tokenizer, cfg.model.max_model_len,
                               ids=ids.to_pylist() if job.id_column in table.column_names else None)
    else:
        missing = (f"text column {job.text_column!r} is not in the shard "
                   f"(columns: {', '.join(table.column_names)}); set job.text_column")
        prompts = [Prompt(row=i, row_key=k, error=missing) for i, k in enumerate(keys)]

    # Request metrics are written with each checkpoint batch, once their rows' results are saved.
    checkpoint = RowCheckpoint(run.path / "checkpoints" / shard.name, job.checkpoint_rows,
                               with_batch=lambda records: write_request_metrics(run.path, shard.name, records))
    resumed = checkpoint.load()

    async def one(p: Prompt) -> RowResult:
        if p.row in resumed:
            return resumed[p.row]
        if p.error is not None:
            result = RowResult(error=p.error, prefill_worker=worker, served=False)
        else:
            async with rows_limit:
                t0 = time.time()
                try:
                    result = await serve(p)
                except Exception as exc:  # one row's failure must not take the shard down
                    if is_worker_failure(exc):
                        raise
                    result = RowResult(error=f"{type(exc).__name__}: {exc}", prefill_worker=worker,
                                       prefill_start=t0)
                result.queue_s = t0 - t_read
                result.prompt_tokens = len(p.token_ids)
                result.prompt_truncated = p.truncated
                result.passage_ids, result.passage_scores = p.passage_ids, p.passage_scores
        progress.add(rows=1, output_tokens=result.output_tokens)
        record = (request_record(result, key=p.row_key, shard=shard.name, row=p.row, read_at=t_read)
                  if result.served else None)
        await checkpoint.add(p.row, result, record)
        return result

    progress.add(rows=len(resumed), output_tokens=sum(r.output_tokens for r in resumed.values()))
    # Rows start as their prompts become ready: all at once, or (RAG) batch by batch as their
    # passages are retrieved, so prefill overlaps retrieval.
    tasks: dict[int, asyncio.Task] = {}
    try:
        async for batch in _prompt_batches(prompts, texts, resumed, cfg, tokenizer):
            for p in batch:
                tasks[p.row] = asyncio.create_task(one(p))
        results = await asyncio.gather(*(tasks[p.row] for p in prompts))
    finally:
        for t in tasks.values():
            t.cancel()
    await checkpoint.flush()  # the last rows' metrics
    table_out = build_output(table, ids, job.id_column, job.text_column, results, rag=job.rag is not None)
    await asyncio.to_thread(write_parquet, table_out, output_url(run.output_dir(), shard))
    checkpoint.clear()
    return {
        "shard": shard.name,
        "rows": len(results),
        "errors": sum(r.error is not None for r in results),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in results),
        "output_tokens": sum(r.output_tokens for r in results),
        "kv_bytes": sum(r.kv_bytes for r in results),
        "worker": worker,
        "resumed_rows": len(resumed),
        "started_at": t_read,
        "finished_at": time.time(),
    }


async def _prompt_batches(prompts: list[Prompt], texts: list, resumed: dict, cfg: Config,
                         tokenizer: Any) -> AsyncIterator[list[Prompt]]:
    """Every prompt once, in batches ready to serve (rows already resumed are served from their
    checkpoint and need no retrieval)."""
    todo = [p for p in prompts if p.row not in resumed]
    yield [p for p in prompts if p.row in resumed]
    if cfg.job.rag is None or not todo:
        yield todo
        return
    from pipeline.rag.job import rag_prompt_batches

    async for batch in rag_prompt_batches(todo, texts, cfg, tokenizer):
        yield batch


def shards_for_task(shards: list[Shard], task: int, n_tasks: int) -> list[Shard]:
    """The shards array task ``task`` of ``n_tasks`` owns: every ``n_tasks``-th, from ``task``."""
    return [s for s in shards if s.index % n_tasks == task]
