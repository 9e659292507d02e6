"""Capacity-aware routing of hand-offs (pipeline.roles.router.DecodeRouter): admission counts
KV tokens against each decode worker's published KV cache size, not requests.

The decode workers here are endpoint records in a real run directory (what a decode worker
publishes at start); no engine is needed to decide where a hand-off goes. Expected choices are
worked out by hand in the comments."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.io.atomic import write_json
from pipeline.runtime.rundir import RunDir
from pipeline.roles.errors import DecodeLost, DecodeUnreachable, KVTooLarge
from pipeline.roles.router import DecodeRouter
from pipeline.wire.auth import sign, verify
from pipeline.wire.messages import Cancel, Handoff, Probe, Received, Result, decode, encode


def _clients(tmp_path, capacities: dict[int, int | None]) -> DecodeRouter:
    run = RunDir(tmp_path)
    for rank, cap in capacities.items():
        run.publish_decode(rank, f"tcp://127.0.0.1:{20000 + rank}", f"decode-{rank}@x", cap)
    return DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)


def test_routes_by_free_kv_not_by_request_count(tmp_path):
    async def go():
        c = _clients(tmp_path, {0: 8192, 1: 16384})
        try:
            # Empty: (0 + 1000) / 8192 = 0.122 vs (0 + 1000) / 16384 = 0.061 -> rank 1.
            assert await c._pick(1, kv_tokens=1000) == 1
            # Rank 1 holds one 12000-token request, rank 0 holds three 500-token ones (more
            # requests, less KV): (1500 + 1000) / 8192 = 0.305 < (12000 + 1000) / 16384 = 0.793
            # -> rank 0, where counting requests would have picked rank 1.
            c.inflight_tokens = {0: 1500, 1: 12000}
            c.inflight = {0: {"a": None, "b": None, "c": None}, 1: {"d": None}}
            assert await c._pick(1, kv_tokens=1000) == 0
            # A 9000-token request fits only rank 1, however loaded.
            assert await c._pick(1, kv_tokens=9000) == 1
        finally:
            c.inflight = {}
            c.close()
    asyncio.run(go())


def test_routes_by_the_load_each_rank_published_and_below_the_row_cap(tmp_path):
    """A rank's load counts what it published (every prefill worker's hand-offs and, with
    pools.elastic, its own units' rows), not only this worker's hand-offs: on the test Slurm a
    prefill worker that counted only its own sent rows to ranks already decoding units of their
    own. With ``row_cap`` (pools.elastic) a rank decoding that many rows is passed over while
    another is below it. By hand, capacities 8192, a 1000-token request."""
    async def go():
        run = RunDir(tmp_path)
        run.publish_decode(0, "tcp://127.0.0.1:20000", "decode-0@x", 8192, decoding=4, kv_tokens_inflight=2000)
        run.publish_decode(1, "tcp://127.0.0.1:20001", "decode-1@x", 8192, decoding=1, kv_tokens_inflight=3000)
        run.publish_decode(2, "tcp://127.0.0.1:20002", "decode-2@x", 8192, decoding=0, kv_tokens_inflight=5000)
        c = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            # (2000 + 1000) / 8192 < (3000 + 1000) / 8192 < (5000 + 1000) / 8192: rank 0, though
            # this worker has sent nothing anywhere (by its own hand-offs all three are empty).
            assert await c._pick(1, kv_tokens=1000) == 0
            # This worker's own hand-offs to rank 0 reach 4000 tokens, more than it published
            # (an older beat): (4000 + 1000) / 8192 > rank 1's 4000 / 8192 -> rank 1.
            c.inflight_tokens = {0: 4000}
            assert await c._pick(1, kv_tokens=1000) == 1
            c.inflight_tokens = {}
            # Row cap 4: rank 0 decodes 4 rows, full; of ranks 1 and 2, rank 1 decodes more
            # rows (1 against 0): packed there, so that rank 2 keeps room for a whole unit.
            c.row_cap = 4
            assert await c._pick(1, kv_tokens=1000) == 1
            # Rank 2 at 2 rows: the most below the cap, though its KV share is the larger.
            run.publish_decode(2, "tcp://127.0.0.1:20002", "decode-2@x", 8192, decoding=2, kv_tokens_inflight=5000)
            c._refresh()
            assert await c._pick(1, kv_tokens=1000) == 2
            # ... unless the request's KV would not fit there: 5000 + 3500 > 8192, so rank 1.
            assert await c._pick(1, kv_tokens=3500) == 1
            run.publish_decode(2, "tcp://127.0.0.1:20002", "decode-2@x", 8192, decoding=0, kv_tokens_inflight=5000)
            c._refresh()
            # Row cap 1: only rank 2 (0 rows) is below it.
            c.row_cap = 1
            assert await c._pick(1, kv_tokens=1000) == 2
            # Every rank at the cap: by KV among them all, as without one. Rank 2's new record is
            # read by the pick itself (older than 0.25 s; the monitor reads every second): rank 2
            # were it still the only one below the cap.
            run.publish_decode(2, "tcp://127.0.0.1:20002", "decode-2@x", 8192, decoding=1, kv_tokens_inflight=5000)
            await asyncio.sleep(0.3)
            assert await c._pick(1, kv_tokens=1000) == 0
        finally:
            c.close()
    asyncio.run(go())


def test_a_retried_row_goes_to_a_worker_it_has_not_failed_on(tmp_path):
    """Seen on the 4-node test Slurm: one prefill node's NIXL handshake to one decode rank timed
    out, and the rows it held failed there again on every try while the other rank was idle.
    A retry prefers a rank the row has not been sent to, by hand: least loaded is rank 0, but
    the row failed on rank 0, so rank 1; a request only rank 0 can hold still goes to rank 0,
    and with every fitting rank tried the usual choice stands."""
    async def go():
        c = _clients(tmp_path, {0: 16384, 1: 8192})
        try:
            assert await c._pick(1, kv_tokens=1000) == 0
            assert await c._pick(1, kv_tokens=1000, tried={0}) == 1
            assert await c._pick(1, kv_tokens=9000, tried={0}) == 0
            assert await c._pick(1, kv_tokens=1000, tried={0, 1}) == 0
            # Prefix routing yields too: whichever rank the prefix hashes to, a row that failed
            # there goes to the other.
            first = await c._pick(1, route="doc-7", kv_tokens=1000)
            assert await c._pick(1, route="doc-7", kv_tokens=1000, tried={first}) == 1 - first
        finally:
            c.close()
    asyncio.run(go())


def test_request_no_worker_can_hold_is_refused_with_the_sizes(tmp_path):
    async def go():
        c = _clients(tmp_path, {0: 8192, 1: 4096})
        try:
            c.check_fits(8192)  # exactly the largest cache: fits
            with pytest.raises(KVTooLarge, match="KV for 8193 tokens .* holds 8192 tokens"):
                c.check_fits(8193)
            with pytest.raises(KVTooLarge):
                await c._pick(1, kv_tokens=10000)
        finally:
            c.close()
    asyncio.run(go())


def test_unknown_capacity_falls_back_to_counting_requests(tmp_path):
    async def go():
        c = _clients(tmp_path, {0: None, 1: None})  # workers that did not publish a size
        try:
            c.check_fits(10**9)  # nothing known: nothing refused
            c.inflight = {0: {"a": None}, 1: {}}
            assert await c._pick(1, kv_tokens=10**6) == 1
        finally:
            c.inflight = {}
            c.close()
    asyncio.run(go())


def _set_heartbeat(run: RunDir, rank: int, heartbeat: float) -> None:
    """Rewrite rank ``rank``'s endpoint file with this heartbeat value (a decode node's clock)."""
    ep = run.decode_endpoints()[rank]
    write_json(run.path / "decode" / f"rank-{rank}.json", {**ep, "heartbeat": heartbeat})


async def _until(condition, timeout_s: float, what: str) -> float:
    """Wait until ``condition()`` holds, polling every 20 ms; returns when (time.monotonic()).
    Fails naming ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.02)
    return time.monotonic()


def test_liveness_follows_heartbeat_changes_not_the_decode_nodes_clock(tmp_path):
    # Three decode nodes whose clocks disagree with this one: rank 0's is an hour behind, rank
    # 1's an hour ahead, rank 2's agrees. Ranks 0 and 1 beat every 0.5 s; rank 2's heartbeat
    # never changes after the first. Comparing clocks would call rank 0 dead at once and rank 1
    # alive forever; what counts is whether the value is seen to change within dead_after_s.
    # The test waits for each change of the router's view itself (its monitor looks every
    # second) and checks when it came: not before dead_after_s of silence.
    dead_after_s = 2.0

    async def go():
        run = RunDir(tmp_path)
        skew = {0: -3600.0, 1: 3600.0, 2: 0.0}
        t0 = time.time()
        for rank in skew:
            run.publish_decode(rank, f"tcp://127.0.0.1:{20000 + rank}", f"decode-{rank}@x", 8192)
            _set_heartbeat(run, rank, t0 + skew[rank])
        created = time.monotonic()  # the router first sees each heartbeat value after this
        c = DecodeRouter(run, timeout_s=5, dead_after_s=dead_after_s, secret=b"k" * 32)
        beating, last_beat = {0, 1}, {}

        async def beat():  # the decode nodes' heartbeats, each on its own clock
            k = 0
            while True:
                await asyncio.sleep(0.5)
                k += 1
                for rank in sorted(beating):
                    _set_heartbeat(run, rank, t0 + skew[rank] + k)
                    last_beat[rank] = time.monotonic()  # the router sees this value after now

        beats = asyncio.create_task(beat())
        lost = asyncio.get_running_loop().create_future()
        try:
            assert c.live == {0, 1, 2}  # first seen: alive
            c.inflight[2] = {"2:0": lost}
            at = await _until(lambda: 2 not in c.live, 10, "rank 2 (silent) dropped")
            assert at - created >= dead_after_s  # not before 2 s of silence
            assert c.live == {0, 1}  # rank 0 alive though "an hour old"
            with pytest.raises(DecodeLost, match="heartbeat did not change for 2 s"):
                await asyncio.wait_for(lost, 0)
            beating.discard(1)  # rank 1 (clock ahead) stops beating
            at = await _until(lambda: 1 not in c.live, 10, "rank 1 (stopped beating) dropped")
            assert at - last_beat[1] >= dead_after_s
            assert c.live == {0}
            _set_heartbeat(run, 2, t0 + 100)  # rank 2 beats again: alive again
            await _until(lambda: 2 in c.live, 10, "rank 2 alive again")
            assert c.live == {0, 2}
        finally:
            beats.cancel()
            c.inflight = {}
            c.close()
    asyncio.run(go())


def test_a_rank_that_acknowledges_nothing_is_skipped_until_it_answers_a_probe(tmp_path):
    """A cut link leaves a decode rank's heartbeat going (it travels through the run directory),
    so only the rank's own acknowledgment can tell. Two real ZeroMQ decode sockets: rank 0
    receives but answers nothing (as a rank behind a cut link would, once the link delivers),
    rank 1 answers. The hand-off to rank 0 (least loaded by rank, by hand) fails after the
    acknowledgment timeout, not the result timeout, and is withdrawn behind itself; new rows
    go to rank 1; once rank 0 answers the probe that follows, it is picked again."""
    import zmq
    import zmq.asyncio

    secret = b"k" * 32

    async def go():
        run = RunDir(tmp_path)
        ctx = zmq.asyncio.Context()
        servers = {}
        for rank in (0, 1):
            servers[rank] = ctx.socket(zmq.ROUTER)
            port = servers[rank].bind_to_random_port("tcp://127.0.0.1")
            run.publish_decode(rank, f"tcp://127.0.0.1:{port}", f"decode-{rank}@x", 8192)

        async def answering():  # rank 1: acknowledges, then answers with a result
            while True:
                peer, data = await servers[1].recv_multipart()
                h = decode(verify(secret, data))
                await servers[1].send_multipart([peer, sign(secret, encode(Received(request_id=h.request_id)))])
                await servers[1].send_multipart([peer, sign(secret, encode(Result(
                    row_key=h.row_key, decode_worker="decode-1@x", token_ids=[1], text="a", finish_reason="stop",
                    error=None, kv_tokens=3, arrived_at=0.0, token_times=[0.0])))])

        c = DecodeRouter(run, timeout_s=30, dead_after_s=30, secret=secret, ack_timeout_s=0.5)
        answers = asyncio.create_task(answering())

        def handoff(n: int) -> Handoff:
            return Handoff(row_key=f"r{n}", request_id=f"r{n}-0", prefill_worker="prefill-0@x", attempt=1.0,
                           prompt_token_ids=[1, 2, 3], sampling={"max_new_tokens": 1}, kv_transfer_params={},
                           prefill_done_at=0.0)
        try:
            t0 = time.monotonic()
            with pytest.raises(DecodeUnreachable, match=r"decode rank 0 \(decode-0@x\) did not acknowledge the "
                                                        r"hand-off within 0.5 s"):
                await c.handoff(handoff(1), wait_s=1)
            assert time.monotonic() - t0 < 5  # the acknowledgment's 0.5 s, not the result's 30 s
            assert set(c.unreachable) == {0} and c.live == {0, 1}
            # Rank 0 got the hand-off, then its withdrawal on the same connection, in that order.
            got = [decode(verify(secret, (await servers[0].recv_multipart())[1])) for _ in range(2)]
            assert isinstance(got[0], Handoff) and got[1] == Cancel(request_id="r1-0")
            # A new row goes to rank 1 though rank 0 is less loaded by rank order.
            res = await c.handoff(handoff(2), wait_s=1)
            assert res.decode_worker == "decode-1@x" and c.inflight_tokens == {0: 0, 1: 0}
            # Rank 0 is probed within a second or two of the timeout; answering makes it reachable.
            peer, data = await asyncio.wait_for(servers[0].recv_multipart(), 5)
            assert isinstance(decode(verify(secret, data)), Probe)
            await servers[0].send_multipart([peer, sign(secret, encode(Received()))])
            await _until(lambda: not c.unreachable, 5, "rank 0 reachable again after answering the probe")
            assert c.unreachable == {} and await c._pick(1, kv_tokens=10) == 0
        finally:
            answers.cancel()
            c.close()
            for s in servers.values():
                s.close(linger=0)
            ctx.term()
    asyncio.run(go())


def test_kv_tokens_a_request_needs_stop_at_the_context_and_count_each_sample():
    from pipeline.config import SamplingConfig
    from pipeline.roles.handoff import kv_tokens_needed

    assert kv_tokens_needed(100, SamplingConfig(max_new_tokens=64), 8192) == 164
    assert kv_tokens_needed(100, SamplingConfig(max_new_tokens=10**9), 8192) == 8192  # ends at the context
    assert kv_tokens_needed(100, SamplingConfig(max_new_tokens=64, n=3), 8192) == 100 + 3 * 64
    assert kv_tokens_needed(8000, SamplingConfig(max_new_tokens=500, n=2), 8192) == 8000 + 2 * 192


def test_a_ranks_load_counts_this_workers_answered_handoffs_off_its_last_heartbeat(tmp_path):
    """pools.elastic: a prefill worker decides whether the decode pool is full from each rank's
    heartbeat (rows it decodes, KV tokens they reach), written every 2 s. A row of this worker
    that just ended there still counts in that figure until the next heartbeat; the router
    takes it off (by hand: 4 rows, 1,000 KV tokens published; one 103-token hand-off answered
    -> 3 rows, 897), until a new heartbeat is read, whose figures then stand as written."""
    import zmq
    import zmq.asyncio

    from pipeline.roles.elastic import decode_full

    secret = b"k" * 32

    async def go():
        run = RunDir(tmp_path)
        ctx = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        endpoint = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
        run.publish_decode(0, endpoint, "decode-0@x", 8192, decoding=4, kv_tokens_inflight=1000)

        async def answering():  # acknowledges, then answers with a result
            while True:
                peer, data = await server.recv_multipart()
                h = decode(verify(secret, data))
                await server.send_multipart([peer, sign(secret, encode(Received(request_id=h.request_id)))])
                await server.send_multipart([peer, sign(secret, encode(Result(
                    row_key=h.row_key, decode_worker="decode-0@x", token_ids=[1], text="a", finish_reason="stop",
                    error=None, kv_tokens=3, arrived_at=0.0, token_times=[0.0])))])

        c = DecodeRouter(run, timeout_s=30, dead_after_s=30, secret=secret, ack_timeout_s=5)
        answers = asyncio.create_task(answering())
        try:
            assert c.load(0) == (4, 1000)
            assert decode_full(c, kv_tokens=10, rows=4) and not decode_full(c, kv_tokens=10, rows=5)
            await c.handoff(Handoff(row_key="r1", request_id="r1-0", prefill_worker="prefill-0@x", attempt=1.0,
                                    prompt_token_ids=[1, 2, 3], sampling={"max_new_tokens": 100},
                                    kv_transfer_params={}, prefill_done_at=0.0), wait_s=1, kv_tokens=103)
            assert c.load(0) == (3, 897)
            assert not decode_full(c, kv_tokens=10, rows=4)  # room again, before the next heartbeat
            time.sleep(0.01)  # the next heartbeat's time differs from the last
            run.publish_decode(0, endpoint, "decode-0@x", 8192, decoding=4, kv_tokens_inflight=1000)
            c._refresh()
            assert c.load(0) == (4, 1000)  # written after the row ended: as written
        finally:
            answers.cancel()
            c.close()
            server.close(linger=0)
            ctx.term()
    asyncio.run(go())
