"""``pools.elastic``: a hand-off's decode rank is named before its prefill
(:mod:`pipeline.roles.announce`), and counts the row in its load from then on. The prefill side
is a real :class:`DecodeRouter` over a real run directory and a real ZeroMQ socket standing in
for the decode rank (no engine is needed to route); the decode side is the
:class:`ElasticDecode` mixin with the attributes a decode rank gives it. Expected choices are
worked out by hand in the comments."""

from __future__ import annotations

import asyncio
import time

import zmq
import zmq.asyncio

from pipeline.config import compose
from pipeline.roles.elastic import ElasticDecode
from pipeline.roles.router import DecodeRouter
from pipeline.runtime.heartbeat import Heartbeat
from pipeline.runtime.rundir import RunDir
from pipeline.wire.auth import sign, verify
from pipeline.wire.messages import Cancel, Expect, Handoff, Received, Result, decode, encode

SECRET = b"k" * 32


def test_an_announced_handoff_counts_on_its_rank_from_the_announcement_to_the_handoff(tmp_path):
    """Rank 0 published 3 rows (the row cap, 3) and 3,000 KV tokens, rank 1 nothing; a
    1,000-token row is announced: rank 1, the one below the cap, which receives the
    announcement, and which this router counts at 1 row, 1,000 tokens until the row is withdrawn
    (rank 1 receives the withdrawal) or handed off (to rank 1, without a new choice: rank 1
    then publishing 1 row and 1,000 tokens more than rank 0 would not move it)."""
    async def go():
        run = RunDir(tmp_path)
        ctx = zmq.asyncio.Context()
        servers = {}
        for rank in (0, 1):
            servers[rank] = ctx.socket(zmq.ROUTER)
            port = servers[rank].bind_to_random_port("tcp://127.0.0.1")
            run.publish_decode(rank, f"tcp://127.0.0.1:{port}", f"decode-{rank}@x", 8192,
                               decoding=3 * (rank == 0), kv_tokens_inflight=3000 * (rank == 0))
        c = DecodeRouter(run, timeout_s=30, dead_after_s=30, secret=SECRET, ack_timeout_s=5)
        c.row_cap = 3

        async def received(rank: int):
            return decode(verify(SECRET, (await asyncio.wait_for(servers[rank].recv_multipart(), 5))[1]))

        try:
            assert await c.announce("r1-0", 1000, None, wait_s=1) == 1
            assert c.load(1) == (1, 1000) and c.load(0) == (3, 3000)
            assert await received(1) == Expect(request_id="r1-0", kv_tokens=1000)
            await c.withdraw("r1-0")
            assert c.load(1) == (0, 0) and c.announced == {}
            assert await received(1) == Cancel(request_id="r1-0")

            assert await c.announce("r2-0", 1000, None, wait_s=1) == 1
            await received(1)
            # Rank 1 now publishes itself busier than rank 0: the announced row still goes there.
            run.publish_decode(1, c.endpoints[1], "decode-1@x", 8192, decoding=4, kv_tokens_inflight=7000)
            c._refresh()
            sent = asyncio.create_task(c.handoff(Handoff(
                row_key="r2", request_id="r2-0", prefill_worker="prefill-0@x", attempt=1.0, prompt_token_ids=[1, 2],
                sampling={"max_new_tokens": 1}, kv_transfer_params={}, prefill_done_at=0.0), wait_s=1, kv_tokens=1000))
            peer, data = await asyncio.wait_for(servers[1].recv_multipart(), 5)
            assert decode(verify(SECRET, data)).request_id == "r2-0"
            assert c.announced == {} and c.inflight_tokens == {1: 1000}  # counted once, as a hand-off
            await servers[1].send_multipart([peer, sign(SECRET, encode(Received(request_id="r2-0")))])
            await servers[1].send_multipart([peer, sign(SECRET, encode(Result(
                row_key="r2", decode_worker="decode-1@x", token_ids=[1], text="a", finish_reason="stop",
                error=None, kv_tokens=2, arrived_at=0.0, token_times=[0.0])))])
            assert (await sent).decode_worker == "decode-1@x" and c.inflight_tokens == {1: 0}
        finally:
            c.close()
            for s in servers.values():
                s.close(linger=0)
            ctx.term()
    asyncio.run(go())


def test_a_decode_rank_counts_announced_handoffs_until_they_come_or_expire():
    """An announced hand-off is decoding for the rank's load (so it claims no unit: full at 4
    rows with 3 of its own), until the hand-off itself arrives (counted once), a withdrawal,
    or the expiry (``transport.handoff_timeout_s`` in a decode rank)."""
    class Rank(ElasticDecode):  # the attributes DecodeServer gives the mixin
        def __init__(self):
            self.cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true",
                                "pools.elastic_idle_s=0", "pools.elastic_decode_rows=4"])
            self.capacity, self.serving, self.handoff_kv, self.expected = 8192, {}, {}, {}
            self.beating = Heartbeat(lambda: None, 2.0, "test-beat")  # poked, never started

    async def go():
        d = Rank()
        d.own_rows, d.own_kv = 3, 900
        assert d.has_room()
        d.expect("h1", 500)
        assert d.load() == {"serving": 0, "decoding": 4, "kv_tokens_inflight": 1400}
        assert d.is_full() and not d.has_room()
        task = asyncio.create_task(asyncio.sleep(0.2))
        d.serving["h1"] = task
        d.count_handoff("h1", 500, task)  # it arrives: one row, not two
        assert d.expected == {} and d.load()["decoding"] == 4 and d.load()["kv_tokens_inflight"] == 1400
        await task
        d.serving.clear()
        d.expect("h2", 500)
        d.unexpect("h2")  # withdrawn
        assert d.load()["decoding"] == 3
        d.expect("h3", 500)
        d.expire_expected(60)
        assert "h3" in d.expected
        d.expected["h3"] = (500, time.monotonic() - 61)
        d.expire_expected(60)
        assert d.expected == {} and d.load()["decoding"] == 3
    asyncio.run(go())
