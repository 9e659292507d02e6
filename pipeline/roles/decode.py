"""Decode worker: accepts hand-offs over the control channel, lets vLLM take each request's KV
over NIXL (``do_remote_prefill``), runs continuous batching across all live requests, and
answers each hand-off with its generation. Exits when nothing is in flight and either every
shard is done or failed, or the launcher asked it to stop."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec
import zmq
import zmq.asyncio

from pipeline.launch.net import side_channel_port, worker_host
from pipeline.launch.rundir import RunDir
from pipeline.roles.auth import Unauthenticated, sign, verify
from pipeline.roles.channel import Handoff, Release, Reserve, Reserved, Result, decode, encode
from pipeline.metrics import StepRecorder
from pipeline.roles.engine import (
    FirstTokenTimeout, Streamed, build_engine, is_worker_failure, kv_bytes_per_token, kv_capacity_tokens, sampling_params,
    stream, worker_id,
)

log = logging.getLogger(__name__)


def decode_main(run_dir: str, rank: int, cpus: str | None) -> str:
    """Entry point of decode rank ``rank`` (one process). Returns the worker id."""
    return asyncio.run(_decode(RunDir(run_dir), rank, cpus))


async def _decode(run: RunDir, rank: int, cpus: str | None) -> str:
    cfg = run.config()
    worker = worker_id("decode", rank)
    # Fault injection (tests only): a decode worker that comes up late, or never within the
    # prefill workers' transport.connect_timeout_s.
    await asyncio.sleep(float(os.environ.get("PD_PIPELINE_INJECT_DECODE_START_DELAY_S", "0") or 0))
    host = worker_host(cfg)
    recorder = StepRecorder(run.path, worker, "decode")
    engine = build_engine(cfg, "decode", cpus=cpus, recorder=recorder,
                          side_channel=(host, side_channel_port(cfg, rank, host)))
    stalls = _injected_kv_stalls()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    port = sock.bind_to_random_port(f"tcp://{host}")
    # Publishing (again, after a requeue) is what lets prefill workers find this rank; refreshing
    # it every 2 s is the heartbeat that tells them this rank is alive.
    endpoint = f"tcp://{host}:{port}"
    capacity = kv_capacity_tokens(engine)
    pool, dram_capacity, polling = None, None, None
    if cfg.offload.dram(cfg.model.max_model_len):
        from pipeline.kv.dram import DramPool, pool_path

        block_size = engine.vllm_config.cache_config.block_size
        pool = DramPool(pool_path(run.path, rank), int(cfg.offload.dram_gib * 2**30),
                        block_size * kv_bytes_per_token(cfg), f"pd-decode{rank}-{os.getpid()}-{int(time.time())}",
                        cfg.transport.nixl_progress_delay_us)
        dram_capacity = pool.num_slots * block_size
        polling = asyncio.create_task(pool.poll_notifications())
    run.publish_decode(rank, endpoint, worker, capacity, dram_capacity)

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(2.0)
            await asyncio.to_thread(run.publish_decode, rank, endpoint, worker, capacity, dram_capacity)

    beating = asyncio.create_task(heartbeat())
    secret = run.secret()
    live: set[asyncio.Task] = set()
    attempts: dict[str, tuple[float, set[asyncio.Task]]] = {}  # owner -> (newest attempt, its tasks)
    # DRAM tier: request id -> (its slots, when reserved); a reservation no hand-off claims within
    # transport.handoff_timeout_s (its owner died between reserving and handing off) is released.
    reserved: dict[str, tuple[list[int], float]] = {}

    async def reserve(peer: bytes, r: Reserve) -> None:
        try:
            slots = await pool.allocate(r.blocks, cfg.transport.handoff_timeout_s)
        except Exception as exc:  # noqa: BLE001 (the owner turns it into the row's error)
            why = str(exc) or f"no {r.blocks} free DRAM-tier blocks within {cfg.transport.handoff_timeout_s:.0f} s"
            answer = Reserved(key=r.key, request_id=r.request_id, pool=None, error=f"{type(exc).__name__}: {why}")
        else:
            reserved[r.request_id] = (slots, time.monotonic())
            answer = Reserved(key=r.key, request_id=r.request_id,
                              pool={**pool.describe(), "slots": slots, "notif": r.request_id})
        await sock.send_multipart([peer, sign(secret, encode(answer))])

    async def release(request_id: str) -> None:
        slots, _ = reserved.pop(request_id, (None, 0))
        if slots is not None:
            await pool.release(slots)

    async def serve_from_dram(h: Handoff) -> Streamed:
        """Wait until the prefill worker's write into the reserved slots completed, then decode
        with the KV loaded from them; the slots are released when the request ends."""
        slots, _ = reserved.pop(h.request_id, (None, 0))
        if slots is None:
            raise FirstTokenTimeout(f"no DRAM-tier reservation for {h.request_id} (expired?)")
        try:
            try:
                await pool.arrived(h.request_id, cfg.transport.kv_timeout_s)
            except asyncio.TimeoutError:
                raise FirstTokenTimeout(f"its KV write into the DRAM tier did not complete within "
                                        f"{cfg.transport.kv_timeout_s:g} s") from None
            params = sampling_params(cfg.job.sampling, max_tokens=h.max_tokens, kv_transfer_params={
                "dram_slots": slots, "dram_pool": {"path": str(pool.path), "num_slots": pool.num_slots}})
            return await stream(engine, h.request_id, h.prompt_token_ids, params)
        finally:
            await pool.release(slots)

    async def serve_from_prefill(h: Handoff, rid: str) -> Streamed:
        """Decode with vLLM's NIXL connector taking the KV from the prefill worker's blocks."""
        # remote_prefill_cached_tokens only feeds vLLM's reporting, where it would replace this
        # engine's own count of prompt tokens it did not compute; drop it so kv_tokens
        # measures what this worker received instead of recomputing.
        kv_params = {k: v for k, v in h.kv_transfer_params.items() if k != "remote_prefill_cached_tokens"}
        params = sampling_params(cfg.job.sampling, max_tokens=h.max_tokens, kv_transfer_params=kv_params)
        return await stream(engine, rid, h.prompt_token_ids, params, first_token_timeout_s=cfg.transport.kv_timeout_s)

    async def serve(peer: bytes, h: Handoff) -> None:
        nonlocal stalls
        arrived = time.time()
        rid = h.request_id
        if stalls > 0:
            # Fault injection (tests): register under an id the prefill engine does not know,
            # so the NIXL push never arrives and the request waits for KV until it times out.
            stalls -= 1
            rid += "stalled"
        try:
            if "dram" in h.kv_transfer_params:
                s = await serve_from_dram(h)
            else:
                s = await serve_from_prefill(h, rid)
            result = Result(key=h.key, decode_worker=worker, token_ids=s.token_ids, text=s.text,
                            finish_reason=s.finish_reason, error=None, kv_tokens=s.num_cached_tokens,
                            arrived_at=arrived, token_times=s.token_times)
        except FirstTokenTimeout as exc:
            log.warning("request %s: its KV did not arrive (%s); asking its owner to prefill it again", rid, exc)
            result = Result(key=h.key, decode_worker=worker, token_ids=[], text="", finish_reason=None,
                            error=f"KV transfer did not complete: {exc}", kv_tokens=0,
                            arrived_at=arrived, token_times=[], retry=True)
        except Exception as exc:  # the row becomes an error row at its owner
            if is_worker_failure(exc):
                raise  # this engine is dead: no answer; the owner's hand-off times out
            result = Result(key=h.key, decode_worker=worker, token_ids=[], text="", finish_reason=None,
                            error=f"decode failed: {type(exc).__name__}: {exc}", kv_tokens=0,
                            arrived_at=arrived, token_times=[])
        await sock.send_multipart([peer, sign(secret, encode(result))])

    try:
        while True:
            if await sock.poll(200, zmq.POLLIN):
                frames = await sock.recv_multipart()
                if len(frames) != 2:
                    continue
                peer, data = frames
                try:
                    msg = decode(verify(secret, data))
                except Unauthenticated:
                    log.warning("dropping a message not signed with this run's secret")
                    continue
                except msgspec.DecodeError as exc:
                    log.warning("dropping a malformed message: %s", exc)
                    continue
                if isinstance(msg, Reserve) and pool is not None:
                    task = asyncio.create_task(reserve(peer, msg))
                    live.add(task)
                    task.add_done_callback(live.discard)
                elif isinstance(msg, Release) and pool is not None:
                    await release(msg.request_id)
                elif isinstance(msg, Handoff):
                    newest, tasks = attempts.get(msg.owner, (msg.attempt, set()))
                    if msg.attempt > newest:
                        # The owner restarted: its earlier attempt's requests have no reader.
                        for t in tasks:
                            t.cancel()
                        newest, tasks = msg.attempt, set()
                    elif msg.attempt < newest:
                        continue
                    task = asyncio.create_task(serve(peer, msg))
                    live.add(task)
                    tasks.add(task)
                    attempts[msg.owner] = (newest, tasks)
                    task.add_done_callback(live.discard)
                    task.add_done_callback(tasks.discard)
            elif not live and (run.stop_requested() or run.all_settled()):
                break
            for request_id, (_, at) in list(reserved.items()):
                if time.monotonic() - at > cfg.transport.handoff_timeout_s:
                    log.warning("releasing the DRAM-tier slots of %s: no hand-off came for them", request_id)
                    await release(request_id)
            if engine.errored:
                raise RuntimeError(f"{worker}: its vLLM engine died; see the log above")
    finally:
        beating.cancel()
        if polling is not None:
            polling.cancel()
            pool.close()
        sock.close()
        ctx.term()
        engine.shutdown()
        recorder.flush()
    return worker


def _injected_kv_stalls() -> int:
    """``PD_PIPELINE_INJECT_KV_STALLS=N``: the first N hand-offs this worker takes never receive
    their KV (fault-injection tests only)."""
    return int(os.environ.get("PD_PIPELINE_INJECT_KV_STALLS", "0") or 0)
