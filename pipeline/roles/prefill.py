"""Prefill worker: owns its shards end to end. For each row it runs a 1-token prefill with
``do_remote_decode`` (vLLM keeps the KV for a NIXL connector), hands the request to the least
loaded decode worker, waits for the generation, and writes the output shard."""

from __future__ import annotations

import asyncio
import time

import msgspec
import zmq
import zmq.asyncio

from pipeline.config import Config
from pipeline.data.output import RowResult
from pipeline.data.prompts import Prompt
from pipeline.launch.net import side_channel_port, worker_host
from pipeline.launch.rundir import RunDir
from pipeline.roles.auth import Unauthenticated, sign, verify
from pipeline.roles.channel import Handoff, Result, decode, encode
from pipeline.roles.engine import (
    build_engine, kv_bytes_per_token, load_tokenizer, request_id, sampling_params, stream,
    worker_id,
)
from pipeline.roles.owner import own_shards, shards_for_task

# What the prefill request tells vLLM's NIXL connectors: keep the KV for a remote decode.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


class DecodeUnavailable(RuntimeError):
    """No decode worker published its endpoint in time."""


async def wait_for_decode(run: RunDir, count: int, timeout_s: float) -> dict[int, dict[str, str]]:
    """Wait until ``count`` decode ranks have published endpoints in the run directory.

    Raises:
        DecodeUnavailable: fewer than ``count`` appeared within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        endpoints = run.decode_endpoints()
        if len(endpoints) >= count:
            return endpoints
        if time.monotonic() > deadline:
            raise DecodeUnavailable(
                f"{len(endpoints)} of {count} decode workers came up within {timeout_s:.0f} s; "
                f"see their logs in {run.logs}")
        await asyncio.sleep(0.5)


class DecodeClients:
    """One DEALER connection per decode worker. :meth:`handoff` sends to the worker with the
    fewest requests in flight and waits for its :class:`Result`."""

    def __init__(self, endpoints: dict[int, dict[str, str]], timeout_s: float, secret: bytes):
        self.ctx = zmq.asyncio.Context()
        self.secret = secret
        self.timeout_s = timeout_s
        self.sockets: dict[int, zmq.asyncio.Socket] = {}
        self.inflight: dict[int, int] = {}
        self.waiting: dict[str, asyncio.Future] = {}
        for rank, ep in endpoints.items():
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(ep["endpoint"])
            self.sockets[rank], self.inflight[rank] = s, 0
        self.receivers = [asyncio.create_task(self._receive(s)) for s in self.sockets.values()]

    async def _receive(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                msg = decode(verify(self.secret, await sock.recv()))
            except (Unauthenticated, msgspec.DecodeError):
                continue
            fut = self.waiting.get(msg.key) if isinstance(msg, Result) else None
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def handoff(self, h: Handoff) -> Result:
        """Send ``h``; return the decode worker's result.

        Raises:
            TimeoutError: no result within ``transport.handoff_timeout_s`` seconds.
        """
        rank = min(self.inflight, key=self.inflight.__getitem__)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[h.key] = fut
        self.inflight[rank] += 1
        try:
            await self.sockets[rank].send(sign(self.secret, encode(h)))
            return await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"decode rank {rank} gave no result within {self.timeout_s:.0f} s") from None
        finally:
            self.inflight[rank] -= 1
            self.waiting.pop(h.key, None)

    def close(self) -> None:
        for t in self.receivers:
            t.cancel()
        for s in self.sockets.values():
            s.close()
        self.ctx.term()


def prefill_main(run_dir: str, task: int, n_tasks: int, cpus: str | None) -> str:
    """Entry point of prefill array task ``task`` of ``n_tasks`` (one process). Returns the
    worker id."""
    return asyncio.run(_prefill(RunDir(run_dir), task, n_tasks, cpus))


async def _prefill(run: RunDir, task: int, n_tasks: int, cpus: str | None) -> str:
    attempt = time.time()
    cfg: Config = run.config()
    worker = worker_id("prefill", task)
    shards = shards_for_task(run.shards(), task, n_tasks)
    if not shards:
        return worker
    host = worker_host(cfg)
    port = side_channel_port(cfg, cfg.pools.decode + task, host)
    engine = build_engine(cfg, "prefill", cpus=cpus, side_channel=(host, port))
    kv_per_token = kv_bytes_per_token(cfg)
    prefill_params = sampling_params(cfg.job.sampling, max_tokens=1, kv_transfer_params=REMOTE_DECODE)
    clients = None
    try:
        endpoints = await wait_for_decode(run, cfg.pools.decode, cfg.transport.connect_timeout_s)
        clients = DecodeClients(endpoints, cfg.transport.handoff_timeout_s, run.secret())

        async def serve(p: Prompt) -> RowResult:
            t0 = time.time()
            pre = await stream(engine, request_id(p.key), p.token_ids, prefill_params)
            t_prefilled = time.time()
            if not pre.kv_transfer_params:
                raise RuntimeError("prefill returned no kv_transfer_params; is a NIXL connector configured?")
            res = await clients.handoff(Handoff(
                key=p.key, owner=worker, attempt=attempt, prompt_token_ids=p.token_ids, max_tokens=cfg.job.sampling.max_new_tokens,
                temperature=cfg.job.sampling.temperature, top_p=cfg.job.sampling.top_p,
                seed=cfg.job.sampling.seed, kv_transfer_params=pre.kv_transfer_params,
                prefill_done_at=t_prefilled))
            first = res.token_times[0] if res.token_times else None
            return RowResult(
                generation=None if res.error else res.text,
                generation_token_ids=None if res.error else res.token_ids,
                finish_reason=res.finish_reason, output_tokens=len(res.token_ids), error=res.error,
                prefill_s=t_prefilled - t0,
                kv_handoff_s=(first - t_prefilled) if first else None,
                ttft_s=(first - t0) if first else None,
                decode_s=(res.token_times[-1] - first) if first else None,
                kv_tokens=res.kv_tokens, kv_bytes=res.kv_tokens * kv_per_token,
                prefill_worker=worker, decode_worker=res.decode_worker,
            )

        await own_shards(run, cfg, shards, worker, load_tokenizer(cfg), serve)
    finally:
        if clients is not None:
            clients.close()
        engine.shutdown()
    return worker
