"""Colocated worker: plain vLLM generation (prefill and decode in one engine) over the shards it
claims. The baseline every disaggregated figure is compared with."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from pipeline.config import Config
from pipeline.engine.build import build_engine, engine_shape, stop_engine
from pipeline.engine.lora import lora_request
from pipeline.engine.model import load_tokenizer
from pipeline.engine.steps import StepRecorder
from pipeline.engine.stream import stream_row
from pipeline.io.output import RowResult, served_row
from pipeline.io.prompts import Prompt
from pipeline.roles.shard_owner import ServeRow
from pipeline.roles.work import claim_first, own_shards
from pipeline.runtime.claims import Claims
from pipeline.runtime.ids import request_id, worker_id
from pipeline.runtime.rundir import RunDir

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


def colocated_main(run_dir: str, task: int, limit: int | None, cpus: str | None) -> str:
    """Entry point of colocated array task ``task`` (one process), which claims shards until none
    is left, at most ``limit`` (None: no limit). Returns the worker id."""
    return asyncio.run(_colocated(RunDir(run_dir), task, limit, cpus))


def colocated_serve(cfg: Config, engine: "AsyncLLM", worker: str, samples: bool) -> ServeRow:
    """Serve a row on ``engine`` alone, prefill and decode: a colocated worker's rows, and those
    of the units an elastic decode rank takes (``pools.elastic``); ``worker`` is the row's
    ``prefill_worker``, its ``decode_worker`` null as in any colocated row. ``samples``: the run's
    sample columns are lists (:meth:`RunDir.sample_lists`)."""

    async def serve(p: Prompt) -> RowResult:
        t0 = time.time()
        s = await stream_row(engine, request_id(p.row_key), p.token_ids, p.sampling or cfg.job.sampling,
                             lora_request=lora_request(cfg, p.lora))
        return served_row(text=s.text, token_ids=s.token_ids, finish_reason=s.finish_reason, error=None,
                          token_times=s.token_times, prefill_start=t0, prefill_end=None,
                          prefill_worker=worker, prefix_cached_tokens=s.num_cached_tokens,
                          stop_reason=s.stop_reason, logprobs=s.logprobs, cumulative_logprob=s.cumulative_logprob,
                          others=s.others, samples=samples)

    return serve


async def _colocated(run: RunDir, task: int, limit: int | None, cpus: str | None) -> str:
    cfg = run.config()
    worker = worker_id("colocated", task)
    # Claims name the task, not its host: a task requeued onto another node resumes its own.
    claims = Claims(run.path, worker.split("@")[0], cfg.pools.claim_dead_after_s)
    if claim_first(run, claims, limit) is None:
        return worker  # every shard is done or held by a live worker: no engine to start
    claims.start_heartbeat()
    recorder = StepRecorder(run.path, worker, "colocated")
    started = time.time()
    engine = build_engine(cfg, "colocated", cpus=cpus, recorder=recorder)
    run.mark_engine_ready(worker, "colocated", started, engine_shape(engine))
    serve = colocated_serve(cfg, engine, worker, run.sample_lists())
    try:
        await own_shards(run, cfg, claims, worker, load_tokenizer(cfg), serve, limit)
    finally:
        claims.stop_heartbeat()
        stop_engine(engine)
        recorder.close()  # the last flush; says what was never written
    return worker
