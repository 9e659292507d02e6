"""Replies the prefill side's router (pipeline.roles.router.DecodeRouter) cannot accept are not
dropped without a word: over a real ZeroMQ connection, a decode rank (a real ROUTER socket
published in a real run directory) sends replies that are unsigned, signed with another secret,
or signed but not a message, before the real ones. Each reason is logged once, naming the
sender; how many were dropped is said when the router closes; the real answer still counts."""

from __future__ import annotations

import asyncio
import logging
import os

import zmq
import zmq.asyncio

from pipeline.roles.router import DecodeRouter
from pipeline.runtime.rundir import RunDir
from pipeline.wire.auth import sign, verify
from pipeline.wire.messages import Handoff, Received, Result, decode, encode

SECRET = b"k" * 32


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pipeline.roles.router" and r.levelno == logging.WARNING]


def test_unsigned_and_malformed_replies_are_said_once_per_reason_and_counted(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "pipeline.roles.router")
    unsigned, wrong_secret, malformed = 3, 2, 2

    async def go():
        run = RunDir(tmp_path)
        ctx = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        endpoint = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
        run.publish_decode(0, endpoint, "decode-0@x", 8192)
        c = DecodeRouter(run, timeout_s=30, dead_after_s=30, secret=SECRET, ack_timeout_s=10)
        h = Handoff(row_key="r1", request_id="r1-0", prefill_worker="prefill-0@x", attempt=1.0,
                    prompt_token_ids=[1, 2, 3], sampling={"max_new_tokens": 1}, kv_transfer_params={},
                    prefill_done_at=0.0)
        result = Result(row_key="r1", decode_worker="decode-0@x", token_ids=[7], text="a", finish_reason="stop",
                        error=None, kv_tokens=3, arrived_at=0.0, token_times=[0.0])
        try:
            served = asyncio.create_task(c.handoff(h, wait_s=5))
            peer, data = await asyncio.wait_for(server.recv_multipart(), 10)
            assert decode(verify(SECRET, data)) == h
            ack = encode(Received(request_id="r1-0"))
            bad = ([ack] * unsigned + [sign(os.urandom(32), encode(result))] * wrong_secret
                   + [sign(SECRET, b"\x93not a message")] * malformed)
            for frame in bad:
                await server.send_multipart([peer, frame])
            # The real answers, behind the bad ones on the same connection (ZeroMQ keeps order).
            for msg in (Received(request_id="r1-0"), result):
                await server.send_multipart([peer, sign(SECRET, encode(msg))])
            got = await asyncio.wait_for(served, 10)
            assert got == result
            return endpoint, _warnings(caplog)
        finally:
            c.close()
            server.close(linger=0)
            ctx.term()

    endpoint, during = asyncio.run(go())
    assert len(during) == 2, during  # one per reason, however many came
    not_signed = [m for m in during if "not signed with this run's secret" in m]
    broken = [m for m in during if ": malformed (" in m]
    assert len(not_signed) == 1 and len(broken) == 1, during
    for m in during:
        assert m.startswith(f"dropping a reply from decode rank 0 (decode-0@x, {endpoint})"), m
    closing = _warnings(caplog)[2:]
    assert sorted(closing) == sorted([
        f"dropped {malformed} replies from decode rank 0 (decode-0@x) in all: malformed",
        f"dropped {unsigned + wrong_secret} replies from decode rank 0 (decode-0@x) in all: not signed with this "
        f"run's secret"])
