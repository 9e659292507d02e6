"""Prefill worker: claims shards and owns each end to end. For each row it runs a 1-token prefill with
``do_remote_decode`` (vLLM keeps the KV for a NIXL connector), hands the request to a decode
worker (:mod:`pipeline.roles.handoff`, :mod:`pipeline.roles.router`), waits for the generation,
and writes the output shard (:mod:`pipeline.roles.shard_owner`)."""

from __future__ import annotations

import asyncio
import time

from pipeline.engine.build import build_engine, engine_shape, stop_engine
from pipeline.engine.model import load_tokenizer, model_kv_bytes_per_token
from pipeline.engine.steps import StepRecorder
from pipeline.roles.colocated import colocated_serve
from pipeline.roles.elastic import ElasticPrefill
from pipeline.roles.handoff import PrefillHandoff, wait_for_decode
from pipeline.roles.router import DecodeRouter
from pipeline.roles.work import claim_first_or_take_over, own_shards, units_left
from pipeline.runtime import failpoints
from pipeline.runtime.addresses import worker_host
from pipeline.runtime.claims import Claims
from pipeline.runtime.ids import worker_id
from pipeline.runtime.ports import start_on_side_channel
from pipeline.runtime.rundir import RunDir


def prefill_main(run_dir: str, task: int, limit: int | None, cpus: str | None) -> str:
    """Entry point of prefill array task ``task`` (one process), which claims shards until none
    is left, at most ``limit`` (None: no limit). Returns the worker id."""
    return asyncio.run(_prefill(RunDir(run_dir), task, limit, cpus))


async def _prefill(run: RunDir, task: int, limit: int | None, cpus: str | None) -> str:
    attempt = time.time()
    cfg = run.config()
    worker = worker_id("prefill", task)
    # Claims name the task, not its host: a task requeued onto another node resumes its own.
    claims = Claims(run.path, worker.split("@")[0], cfg.pools.claim_dead_after_s)
    if await claim_first_or_take_over(run, claims, limit) is None:
        return worker  # every shard is done or held by a live worker: no engine to start
    claims.start_heartbeat()
    # Fault injection (tests only): a prefill worker that comes up late (pools.elastic).
    await asyncio.sleep(failpoints.prefill_start_delay_s())
    host = worker_host(cfg)
    recorder = StepRecorder(run.path, worker, "prefill")
    # A taken port fails fast, named; a free port lost before vLLM bound it is picked again.
    started = time.time()
    engine = start_on_side_channel(cfg, cfg.pools.decode + task, host, lambda port: build_engine(
        cfg, "prefill", cpus=cpus, side_channel=(host, port), recorder=recorder))
    run.mark_engine_ready(worker, "prefill", started, engine_shape(engine))
    router = None
    try:
        await wait_for_decode(run, cfg.pools.decode, cfg.transport.connect_timeout_s)
        router = DecodeRouter(run, cfg.transport.handoff_timeout_s, cfg.transport.decode_dead_after_s,
                              run.secret(), cfg.transport.ack_timeout_s)
        handoff = PrefillHandoff(cfg, engine, router, worker, attempt, model_kv_bytes_per_token(cfg),
                                 run.sample_lists())
        serve, rows, room = handoff.serve, cfg.job.batch_rows, (lambda: True)
        if cfg.pools.elastic:  # rows served here when the decode pool is full, beside the hand-offs
            elastic = ElasticPrefill(cfg, handoff, colocated_serve(cfg, engine, worker, run.sample_lists()),
                                     units_left=units_left(run, claims))
            serve, rows, room = elastic.serve, rows * 2, elastic.room
        await own_shards(run, cfg, claims, worker, load_tokenizer(cfg), serve, limit, keep_claiming=room,
                         batch_rows=rows)
    finally:
        claims.stop_heartbeat()
        if router is not None:
            router.close()
        stop_engine(engine)
        recorder.close()  # the last flush; says what was never written
    return worker
