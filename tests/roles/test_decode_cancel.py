"""A withdrawn hand-off at the decode side (pipeline.roles.decode.DecodeServer), deterministic:
the real decode server on a real ZeroMQ socket, a prefill worker's real DEALER socket, signed
messages; no engine.

A prefill worker that gets no acknowledgment in time withdraws the hand-off (:class:`Cancel`,
queued behind it on the same connection) and serves the row elsewhere. The decode worker must
then drop it: cancel the task serving it (which aborts the request in the engine, freeing its
KV) and send no result, so the row is never decoded twice. On the multi-node test Slurm this
happens only when a cut link heals in time, so it is tested here, for each order the messages
can arrive in: right behind the hand-off, while the engine runs the request, after the result
went out (nothing left to drop), and before a hand-off of that id (a Cancel of an unknown
request is ignored; only the hand-off's own connection orders the two).

The engine is a stand-in (:class:`_Engine`): what is tested is the decode server's bookkeeping,
and the stand-in records what a vLLM engine would be asked to do (start a request, have it
aborted, finish it), and finishes a request only when the test says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from types import SimpleNamespace

import zmq
import zmq.asyncio

from pipeline.config import SamplingConfig, compose
from pipeline.io.shards import list_shards
from pipeline.roles.decode import DecodeServer
from pipeline.runtime.rundir import RunDir
from pipeline.wire.auth import sign, verify
from pipeline.wire.messages import Cancel, Handoff, Received, Result, decode, encode
from tests.helpers import SAMPLE


class _Engine:
    """Stands in for vLLM's ``AsyncLLM`` as the decode server uses it: ``generate`` streams one
    finished output once ``release[request_id]`` is set; interrupted before that (the request
    aborted), it records the request in ``aborted``."""

    errored = False

    def __init__(self):
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=64, block_size=16))
        self.started: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.release: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.aborted: set[str] = set()
        self.finished: set[str] = set()

    async def generate(self, prompt, params, request_id, lora_request=None):
        self.started[request_id].set()
        done = False
        try:
            await self.release[request_id].wait()
            done = True
            self.finished.add(request_id)
            yield SimpleNamespace(
                outputs=[SimpleNamespace(index=0, logprobs=None, cumulative_logprob=None, token_ids=[7, 8],
                                         text="ok", finish_reason="stop", stop_reason=None)],
                num_cached_tokens=3, finished=True, kv_transfer_params=None)
        finally:
            if not done:
                self.aborted.add(request_id)


def _handoff(request_id: str) -> Handoff:
    return Handoff(row_key=request_id.split("-")[0], request_id=request_id, prefill_worker="prefill-0@x",
                   attempt=1.0, prompt_token_ids=[1, 2, 3],
                   sampling=dataclasses.asdict(SamplingConfig(max_new_tokens=2)),
                   kv_transfer_params={"do_remote_prefill": True, "remote_engine_id": "e"}, prefill_done_at=0.0)


async def _until(condition, what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.01)


def test_a_withdrawn_handoff_is_dropped_in_every_order(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pipeline.roles.decode")

    async def go():
        cfg = compose(["+job=summarize", "pools=disaggregated", "offload=none", f"job.input={SAMPLE}"])
        run = RunDir(tmp_path / "run")
        run.create(cfg, list_shards(str(SAMPLE)), str(tmp_path / "out"), 24)
        secret = run.secret()
        engine = _Engine()
        server = DecodeServer(run, cfg, 0, "decode-0@x", engine, "127.0.0.1")
        serving = asyncio.create_task(server.serve_forever())
        ctx = zmq.asyncio.Context()
        prefill = ctx.socket(zmq.DEALER)  # one prefill worker's connection, as DecodeRouter makes it
        prefill.setsockopt(zmq.LINGER, 0)
        prefill.connect(server.endpoint)

        async def send(msg) -> None:
            await prefill.send(sign(secret, encode(msg)))

        async def receive():
            return decode(verify(secret, await asyncio.wait_for(prefill.recv(), 10)))

        async def served(request_id: str) -> list:
            """Hand ``request_id`` off, let the engine finish it, and return every message that
            came back up to its result (in order: one connection keeps it)."""
            await send(_handoff(request_id))
            await _until(engine.started[request_id].is_set, f"{request_id} started")
            engine.release[request_id].set()
            got = []
            while not (got and isinstance(got[-1], Result) and got[-1].row_key == request_id.split("-")[0]):
                got.append(await receive())
            return got

        def withdrawn(request_id: str) -> str:
            return (f"request {request_id}: its prefill worker withdrew it (no acknowledgment reached it in time) "
                    f"and serves its row elsewhere; dropping it here")

        try:
            # 1. The Cancel right behind its hand-off, as the prefill worker sends it.
            await send(_handoff("a-0"))
            await send(Cancel(request_id="a-0"))
            assert await receive() == Received(request_id="a-0")  # acknowledged at once, as always
            await _until(lambda: withdrawn("a-0") in caplog.text, "a-0's Cancel taken")
            engine.release["a-0"].set()  # a task still serving it would now finish and answer
            # 2. The Cancel while the engine runs the request: its task is cancelled, which
            # aborts the request in the engine.
            await send(_handoff("b-0"))
            assert await receive() == Received(request_id="b-0")
            await _until(engine.started["b-0"].is_set, "b-0 started in the engine")
            await send(Cancel(request_id="b-0"))
            await _until(lambda: "b-0" in engine.aborted, "b-0 aborted in the engine")
            engine.release["b-0"].set()
            # Another hand-off on the same connection is served; nothing came back for a-0 or b-0
            # before its result, and nothing of theirs is left running.
            got = await served("c-0")
            assert got == [Received(request_id="c-0"), got[-1]] and got[-1].token_ids == [7, 8], got
            assert got[-1].error is None and got[-1].decode_worker == "decode-0@x"
            await _until(lambda: not server.live, "no task left")
            assert "a-0" not in engine.finished and ("a-0" not in engine.started or "a-0" in engine.aborted)
            assert "b-0" not in engine.finished and "b-0" in engine.aborted
            assert "a-0" not in server.serving and "b-0" not in server.serving
            assert withdrawn("a-0") in caplog.text and withdrawn("b-0") in caplog.text
            # 3. The Cancel after the result went out: nothing to drop, nothing said, and the
            # worker goes on serving.
            await send(Cancel(request_id="c-0"))
            # 4. A Cancel of a request this worker never saw (here: before its hand-off, which
            # one connection never delivers in that order) is ignored: the hand-off after it is
            # served.
            await send(Cancel(request_id="d-0"))
            got = await served("d-0")
            assert got == [Received(request_id="d-0"), got[-1]] and got[-1].token_ids == [7, 8], got
            assert engine.finished == {"c-0", "d-0"} and engine.aborted <= {"a-0", "b-0"}
            assert withdrawn("c-0") not in caplog.text and withdrawn("d-0") not in caplog.text
            run.request_stop()
            await asyncio.wait_for(serving, 10)
        finally:
            serving.cancel()
            prefill.close()
            server.close()
            ctx.term()

    asyncio.run(go())
