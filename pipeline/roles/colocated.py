"""Colocated worker: plain vLLM generation (prefill and decode in one engine) over the shards it
owns. The baseline every disaggregated figure is compared with."""

from __future__ import annotations

import asyncio
import time

from pipeline.data.output import RowResult
from pipeline.data.prompts import Prompt
from pipeline.launch.rundir import RunDir
from pipeline.metrics import StepRecorder
from pipeline.roles.engine import (
    build_engine, load_tokenizer, request_id, sampling_params, stream, worker_id,
)
from pipeline.roles.owner import own_shards, shards_for_task


def colocated_main(run_dir: str, task: int, n_tasks: int, cpus: str | None) -> str:
    """Entry point of colocated array task ``task`` of ``n_tasks`` (one process). Returns the
    worker id."""
    return asyncio.run(_colocated(RunDir(run_dir), task, n_tasks, cpus))


async def _colocated(run: RunDir, task: int, n_tasks: int, cpus: str | None) -> str:
    cfg = run.config()
    worker = worker_id("colocated", task)
    shards = shards_for_task(run.shards(), task, n_tasks)
    if not shards:
        return worker
    recorder = StepRecorder(run.path, worker, "colocated")
    engine = build_engine(cfg, "colocated", cpus=cpus, recorder=recorder)
    params = sampling_params(cfg.job.sampling)

    async def serve(p: Prompt) -> RowResult:
        t0 = time.time()
        s = await stream(engine, request_id(p.key), p.token_ids, params)
        first = s.token_times[0] if s.token_times else None
        return RowResult(
            generation=s.text, generation_token_ids=s.token_ids, finish_reason=s.finish_reason,
            output_tokens=len(s.token_ids),
            prefill_s=(first - t0) if first else None, ttft_s=(first - t0) if first else None,
            decode_s=(s.token_times[-1] - first) if first else None,
            prefill_worker=worker,
            metrics={"prefill_start": t0, "token_times": s.token_times,
                     "prefix_cached_tokens": s.num_cached_tokens, "tries": 1},
        )

    try:
        await own_shards(run, cfg, shards, worker, load_tokenizer(cfg), serve)
    finally:
        engine.shutdown()
        recorder.flush()
    return worker
