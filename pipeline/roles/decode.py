"""Decode worker: accepts hand-offs over the control channel, lets vLLM take each request's KV
over NIXL (``do_remote_prefill``), runs continuous batching across all live requests, and
answers each hand-off with its generation. With ``pools.elastic`` it also claims work units
while it is neither full nor sent hand-offs and serves them colocated in its engine
(:meth:`DecodeServer.take_units`). Exits when nothing is in flight and either every shard is
done or failed, or the launcher asked it to stop."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

import msgspec
import zmq
import zmq.asyncio

from pipeline.config import Config, SamplingConfig
from pipeline.engine.build import build_engine, engine_shape, progress_delay_us, stop_engine
from pipeline.engine.kv_layout import kv_capacity_tokens
from pipeline.engine.lora import lora_request
from pipeline.engine.model import model_kv_bytes_per_token
from pipeline.engine.steps import StepRecorder
from pipeline.engine.stream import FirstTokenTimeout, RequestFailed, Streamed, stream_row, stream_samples
from pipeline.io.metrics import write_dram_use
from pipeline.roles.elastic import ElasticDecode
from pipeline.roles.errors import is_worker_failure
from pipeline.roles.handoff import kv_tokens_needed
from pipeline.roles.recompute import NORMAL_COMPUTED, computed_on_decode, recompute_error
from pipeline.runtime import failpoints
from pipeline.runtime.addresses import worker_host
from pipeline.runtime.heartbeat import Heartbeat
from pipeline.runtime.ids import worker_id
from pipeline.runtime.ports import start_on_side_channel
from pipeline.runtime.rundir import RunDir
from pipeline.wire.auth import Unauthenticated, sign, verify
from pipeline.wire.messages import (Cancel, Expect, Handoff, Probe, Received, Release, Renew, Reserve, Reserved,
                                    Result, Sample, decode, encode)

if TYPE_CHECKING:
    from pipeline.engine.dram_pool import DramPool

log = logging.getLogger(__name__)


def decode_main(run_dir: str, rank: int, cpus: str | None) -> str:
    """Entry point of decode rank ``rank`` (one process). Returns the worker id."""
    return asyncio.run(_decode(RunDir(run_dir), rank, cpus))


async def _decode(run: RunDir, rank: int, cpus: str | None) -> str:
    cfg = run.config()
    worker = worker_id("decode", rank)
    # Fault injection (tests only): a decode worker that comes up late, or never within the
    # prefill workers' transport.connect_timeout_s.
    await asyncio.sleep(failpoints.decode_start_delay_s())
    host = worker_host(cfg)
    recorder = StepRecorder(run.path, worker, "decode")
    # A taken port fails fast, named; a free port lost before vLLM bound it is picked again.
    started = time.time()
    engine = start_on_side_channel(cfg, rank, host, lambda port: build_engine(
        cfg, "decode", cpus=cpus, recorder=recorder, side_channel=(host, port)))
    run.mark_engine_ready(worker, "decode", started, engine_shape(engine))
    server = DecodeServer(run, cfg, rank, worker, engine, host)
    try:
        if cfg.pools.elastic:
            server.start_taking_units()
        await server.serve_forever()
    finally:
        server.close()
        stop_engine(engine)
        recorder.close()  # the last flush; says what was never written
    return worker


class DecodeServer(ElasticDecode):
    """One decode rank's control socket and its requests in flight.

    Binds a ZeroMQ ROUTER on ``host`` and publishes its endpoint (and KV/DRAM-tier capacity) in
    the run directory, refreshed every 2 s as the heartbeat. Each :class:`Handoff` is acknowledged
    at once (:class:`Received`, as are :class:`Reserve` and :class:`Probe`) and becomes a task
    streaming the request from ``engine``, which a :class:`Cancel` of its request id ends; with
    ``offload=dram`` it also owns the DRAM tier and answers :class:`Reserve` / :class:`Release` /
    :class:`Renew`; with ``pools.elastic`` an :class:`Expect` counts a hand-off announced before its
    prefill in this rank's load until it arrives (:meth:`ElasticDecode.expect`).
    """

    def __init__(self, run: RunDir, cfg: Config, rank: int, worker: str, engine, host: str):
        self.run, self.cfg, self.rank, self.worker, self.engine = run, cfg, rank, worker, engine
        self.kv_faults, self.kv_skips = failpoints.kv_faults(), failpoints.kv_skips()  # fault injection (tests only)
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self.capacity = kv_capacity_tokens(engine)
        self.pool: DramPool | None = None
        self.dram_capacity = None
        self.polling: asyncio.Task | None = None
        if cfg.offload.dram(cfg.model.max_model_len):
            from pipeline.engine.dram_pool import DramPool, pool_path

            self.block_size = block_size = engine.vllm_config.cache_config.block_size
            self.pool = DramPool(pool_path(run.path, rank), int(cfg.offload.dram_gib * 2**30),
                                 block_size * model_kv_bytes_per_token(cfg),
                                 f"pd-decode{rank}-{os.getpid()}-{int(time.time())}",
                                 progress_delay_us(cfg), writers=cfg.model.prefill_tp)
            self.dram_capacity = self.pool.num_slots * block_size
            self.polling = asyncio.create_task(self.pool.poll_notifications())
        # Publishing (again, after a requeue) is what lets prefill workers find this rank;
        # refreshing it every 2 s is the heartbeat that tells them this rank is alive, from its
        # own thread: a busy or starved event loop is not a lost rank (pipeline.runtime.heartbeat).
        self._publish()
        self.beating = Heartbeat(self._publish, 2.0, f"decode-heartbeat-{rank}").start()
        self.secret = run.secret()
        self.live: set[asyncio.Task] = set()
        self.serving: dict[str, asyncio.Task] = {}  # request id -> the task serving its hand-off
        self.handoff_kv: dict[str, int] = {}  # request id -> KV tokens its hand-off may reach
        self.expected: dict[str, tuple[int, float]] = {}  # pools.elastic: announced hand-offs (expect)
        # prefill worker -> (its newest attempt, that attempt's tasks)
        self.attempts: dict[str, tuple[float, set[asyncio.Task]]] = {}
        # DRAM tier: request id -> (its slots, when reserved or last renewed); a reservation that
        # no hand-off claims and its prefill worker has not renewed (:class:`Renew`) for
        # transport.handoff_timeout_s (that worker died between reserving and handing off) is
        # released.
        self.reserved: dict[str, tuple[list[int], float]] = {}
        self.taking: asyncio.Task | None = None  # pools.elastic: take_units
        self.claims = None  # pools.elastic: this rank's Claims

    def _publish(self) -> None:
        self.run.publish_decode(self.rank, self.endpoint, self.worker, self.capacity, self.dram_capacity,
                                **self.load())

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.live.add(task)
        task.add_done_callback(self.live.discard)
        return task

    async def serve_forever(self) -> None:
        """Answer messages until nothing is in flight and the run is settled or stopped.

        Raises:
            RuntimeError: the vLLM engine died.
        """
        while True:
            if await self.sock.poll(200, zmq.POLLIN):
                await self._receive()
            elif not self.live and (self.taking is None or self.taking.done()) and (
                    self.run.stop_requested() or self.run.all_settled()):
                if self.taking is not None:
                    self.taking.result()  # its failure is this worker's
                return
            elif self.taking is not None and self.taking.done() and self.taking.exception() is not None:
                raise self.taking.exception()
            self.expire_expected(self.cfg.transport.handoff_timeout_s)
            for request_id, (_, at) in list(self.reserved.items()):
                if time.monotonic() - at > self.cfg.transport.handoff_timeout_s:
                    log.warning("releasing the DRAM-tier slots of %s: no hand-off came for them, and its prefill "
                                "worker stopped renewing them", request_id)
                    await self._release(request_id)
            if self.engine.errored:
                raise RuntimeError(f"{self.worker}: its vLLM engine died; see the log above")

    async def _receive(self) -> None:
        frames = await self.sock.recv_multipart()
        if len(frames) != 2:
            return
        peer, data = frames
        try:
            msg = decode(verify(self.secret, data))
        except Unauthenticated:
            log.warning("dropping a message not signed with this run's secret")
            return
        except msgspec.DecodeError as exc:
            log.warning("dropping a malformed message: %s", exc)
            return
        if isinstance(msg, (Handoff, Reserve, Probe)):
            await self._answer(peer, Received(request_id=getattr(msg, "request_id", None)))
        if isinstance(msg, Cancel):
            # Its prefill worker got no acknowledgment in time (a cut link delivers the hand-off
            # late, then this) and serves the row elsewhere.
            task = self.serving.get(msg.request_id)
            if task is not None or msg.request_id in self.reserved:
                log.warning("request %s: its prefill worker withdrew it (no acknowledgment reached it in "
                            "time) and serves its row elsewhere; dropping it here", msg.request_id)
            if task is not None:
                task.cancel()
            self.unexpect(msg.request_id)
            if self.pool is not None:
                await self._release(msg.request_id)
        elif isinstance(msg, Expect):
            self.expect(msg.request_id, msg.kv_tokens)
        elif isinstance(msg, Reserve) and self.pool is not None:
            self._track(msg.request_id, self._spawn(self._reserve(peer, msg)))
        elif isinstance(msg, Release) and self.pool is not None:
            await self._release(msg.request_id)
        elif isinstance(msg, Renew):
            now = time.monotonic()
            for rid in msg.request_ids:
                if rid in self.reserved:
                    self.reserved[rid] = (self.reserved[rid][0], now)
        elif isinstance(msg, Handoff):
            newest, tasks = self.attempts.get(msg.prefill_worker, (msg.attempt, set()))
            if msg.attempt > newest:
                # The prefill worker restarted: its earlier attempt's requests have no reader.
                for t in tasks:
                    t.cancel()
                newest, tasks = msg.attempt, set()
            elif msg.attempt < newest:
                return
            task = self._spawn(self._serve(peer, msg))
            tasks.add(task)
            self.attempts[msg.prefill_worker] = (newest, tasks)
            task.add_done_callback(tasks.discard)
            self._track(msg.request_id, task)
            self.count_handoff(msg.request_id, kv_tokens_needed(
                len(msg.prompt_token_ids), SamplingConfig(**msg.sampling), self.cfg.model.max_model_len), task)

    def _track(self, request_id: str, task: asyncio.Task) -> None:
        """``task`` serves ``request_id`` (its reservation, then its hand-off) until it ends."""
        self.serving[request_id] = task
        task.add_done_callback(lambda t: self.serving.pop(request_id) if self.serving.get(request_id) is t else None)

    async def _answer(self, peer: bytes, msg: Result | Reserved) -> None:
        await self.sock.send_multipart([peer, sign(self.secret, encode(msg))])

    async def _reserve(self, peer: bytes, r: Reserve) -> None:
        timeout_s = self.cfg.transport.handoff_timeout_s
        self.pool.forget(r.request_id)  # a requeued prefill worker reuses the id: no write of before counts
        try:
            slots = await self.pool.allocate(r.blocks, timeout_s)
        except Exception as exc:  # noqa: BLE001 (the prefill worker turns it into the row's error)
            why = str(exc) or f"no {r.blocks} free DRAM-tier blocks within {timeout_s:.0f} s"
            answer = Reserved(row_key=r.row_key, request_id=r.request_id, pool=None,
                              error=f"{type(exc).__name__}: {why}")
        else:
            self.reserved[r.request_id] = (slots, time.monotonic())
            answer = Reserved(row_key=r.row_key, request_id=r.request_id,
                              pool={**self.pool.describe(), "slots": slots, "notif": r.request_id})
        await self._answer(peer, answer)

    async def _release(self, request_id: str) -> None:
        slots, _ = self.reserved.pop(request_id, (None, 0))
        if slots is not None:
            await self.pool.release(slots)

    async def _from_dram(self, h: Handoff) -> Streamed:
        """Wait until the prefill worker's write into the reserved slots completed, then decode
        with the KV loaded from them; the slots are released when the request ends."""
        slots, _ = self.reserved.pop(h.request_id, (None, 0))
        if slots is None:
            raise FirstTokenTimeout(f"no DRAM-tier reservation for {h.request_id} (expired?)")
        kv_timeout_s = self.cfg.transport.kv_timeout_s
        try:
            try:
                await self.pool.arrived(h.request_id, kv_timeout_s)
            except asyncio.TimeoutError:
                raise FirstTokenTimeout(f"its KV write into the DRAM tier did not complete within "
                                        f"{kv_timeout_s:g} s") from None
            kv_params = {"dram_slots": slots, "dram_pool": {"path": str(self.pool.path), "num_slots": self.pool.num_slots}}
            return await stream_samples(self.engine, h.request_id, h.prompt_token_ids, SamplingConfig(**h.sampling),
                                        kv_params, lora_request=lora_request(self.cfg, h.lora))
        finally:
            await self.pool.release(slots)

    async def _from_prefill(self, h: Handoff, rid: str, kv_params: dict) -> Streamed:
        """Decode with vLLM's NIXL connector taking the KV from the prefill worker's blocks."""
        return await stream_samples(self.engine, rid, h.prompt_token_ids, SamplingConfig(**h.sampling), kv_params,
                                    first_token_timeout_s=self.cfg.transport.kv_timeout_s,
                                    lora_request=lora_request(self.cfg, h.lora))

    def _nixl_params(self, h: Handoff) -> tuple[str, dict]:
        """The request id and KV transfer parameters the decode engine gets for ``h``.

        ``remote_prefill_cached_tokens`` only feeds vLLM's reporting, where it would replace this
        engine's own count of prompt tokens it did not compute; it is dropped so ``kv_tokens``
        measures what this worker received instead of recomputing. Fault injection (tests only,
        :func:`pipeline.runtime.failpoints.kv_faults`) breaks the first hand-offs' transfer for
        real: with push the request is registered under an id the prefill engine does not know
        (its KV never arrives, the request times out); with pull it names a prefill engine that
        does not exist (vLLM's NIXL handshake fails and the load fails). The next hand-offs
        (:func:`pipeline.runtime.failpoints.kv_skips`) are served without their KV: without
        ``do_remote_prefill`` vLLM loads nothing and computes the prompt itself, as when the KV
        silently does not arrive."""
        rid = h.request_id
        kv_params = {k: v for k, v in h.kv_transfer_params.items() if k != "remote_prefill_cached_tokens"}
        if self.kv_faults > 0:
            self.kv_faults -= 1
            if self.cfg.transport.connector == "NixlPushConnector" or "remote_engine_id" not in kv_params:
                rid += "stalled"
            else:
                kv_params["remote_engine_id"] = f"{kv_params['remote_engine_id']}-injected-fault"
        elif self.kv_skips > 0:
            self.kv_skips -= 1
            kv_params["do_remote_prefill"] = False
        return rid, kv_params

    def _recomputed(self, h: Handoff, kv_tokens: int) -> str | None:
        """Warn when this worker computed more of ``h``'s prompt than its last token, ``kv_tokens``
        of it having arrived as KV (:mod:`pipeline.roles.recompute`); returns the row's error
        under ``transport.on_recompute=fail``, else None."""
        prompt = len(h.prompt_token_ids)
        computed = computed_on_decode(prompt, kv_tokens)
        if computed <= NORMAL_COMPUTED:
            return None
        log.warning("request %s: this decode worker recomputed %d of its %d prompt tokens, no KV having been "
                    "loaded for them (transport.on_recompute=%s)", h.request_id, computed, prompt,
                    self.cfg.transport.on_recompute)
        return recompute_error(prompt, kv_tokens, self.cfg.transport.on_recompute)

    async def _local(self, h: Handoff) -> Streamed:
        """A row handed off without KV (a prompt under ``pools.local_prefill_tokens``): this
        engine prefills it and decodes it like a colocated engine would."""
        return await stream_row(self.engine, h.request_id, h.prompt_token_ids, SamplingConfig(**h.sampling),
                                lora_request=lora_request(self.cfg, h.lora))

    async def _serve(self, peer: bytes, h: Handoff) -> None:
        arrived = time.time()
        failed = dict(row_key=h.row_key, decode_worker=self.worker, token_ids=[], text="",
                      finish_reason=None, kv_tokens=0, arrived_at=arrived, token_times=[])
        local = not h.kv_transfer_params
        try:
            if local:
                s = await self._local(h)
            elif "dram" in h.kv_transfer_params:
                s = await self._from_dram(h)
            else:
                s = await self._from_prefill(h, *self._nixl_params(h))
            result = Result(row_key=h.row_key, decode_worker=self.worker, token_ids=s.token_ids, text=s.text,
                            finish_reason=s.finish_reason, error=None, kv_tokens=s.num_cached_tokens,
                            arrived_at=arrived, token_times=s.token_times, stop_reason=s.stop_reason,
                            logprobs=s.logprobs, cumulative_logprob=s.cumulative_logprob,
                            others=[Sample(token_ids=o.token_ids, text=o.text, finish_reason=o.finish_reason,
                                           stop_reason=o.stop_reason, logprobs=o.logprobs,
                                           cumulative_logprob=o.cumulative_logprob) for o in s.others])
            recomputed = None if local else self._recomputed(h, s.num_cached_tokens)
            if recomputed:  # transport.on_recompute=fail: an error row (not served again) with the KV that arrived
                result = Result(**{**failed, "kv_tokens": s.num_cached_tokens}, error=recomputed)
        except (FirstTokenTimeout, RequestFailed) as exc:
            if local:  # nothing was to arrive: the request itself failed
                result = Result(**failed, error=f"decode failed: {exc}")
            else:
                timeout = isinstance(exc, FirstTokenTimeout)
                log.warning("request %s: %s (%s); asking its prefill worker to prefill it again", h.request_id,
                            "its KV did not arrive" if timeout else "its KV could not be loaded", exc)
                result = Result(**failed, retry=True, error="KV transfer did not complete: " + (
                    str(exc) if timeout else f"the KV load failed ({exc})"))
        except Exception as exc:  # the row becomes an error row at its prefill worker
            if is_worker_failure(exc):
                raise  # this engine is dead: no answer; the prefill worker's hand-off times out
            result = Result(**failed, error=f"decode failed: {type(exc).__name__}: {exc}")
        await self._answer(peer, result)

    def close(self) -> None:
        self.beating.stop()  # before the last publish, which a beat must not overwrite
        if self.taking is not None:
            self.taking.cancel()
        if self.claims is not None:
            self.claims.stop_heartbeat()
        try:
            self.run.publish_decode(self.rank, self.endpoint, self.worker, self.capacity, self.dram_capacity,
                                    stopped=True)
        except OSError:
            pass  # then the launcher waits for its heartbeat to stand still
        if self.polling is not None:
            self.polling.cancel()
            write_dram_use(self.run.path, self.worker, {**self.pool.use_record(), "block_tokens": self.block_size})
            self.pool.close()
        self.sock.close()
        self.ctx.term()
