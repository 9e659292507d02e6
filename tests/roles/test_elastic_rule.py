"""The prefill side's rule of ``pools.elastic`` (:func:`pipeline.roles.elastic.decode_full`): a
row is served on the prefill worker alone only when every live decode rank is full for it. The
decode ranks are endpoint records in a real run directory, written by
:meth:`RunDir.publish_decode` as a decode rank's heartbeat writes them, read by a real
:class:`DecodeRouter`; each expected answer is worked out by hand in the comments."""

from __future__ import annotations

import asyncio

from pipeline.io.shards import list_shards
from pipeline.roles.elastic import decode_full
from pipeline.roles.router import DecodeRouter
from pipeline.runtime.rundir import RunDir
from tests.helpers import SAMPLE


def test_decode_is_full_only_when_every_rank_is(tmp_path):
    run = RunDir(tmp_path)
    # Rank 0: 8,192 KV tokens, decoding 4 rows that may reach 6,000 tokens; rank 1: 4,096 tokens,
    # decoding 1 row (1,000 tokens).
    run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=4, kv_tokens_inflight=6000)
    run.publish_decode(1, "tcp://127.0.0.1:21001", "decode-1@x", 4096, decoding=1, kv_tokens_inflight=1000)

    async def go():
        r = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            # Full at 4 rows: rank 0 is (4 >= 4), rank 1 is not (1 < 4; 1,000 + 500 <= 4,096).
            assert not decode_full(r, 500, rows=4)
            # A 3,500-token row: rank 1's KV would reach 4,500 > 4,096; rank 0 is full by rows.
            assert decode_full(r, 3500, rows=4)
            # Full at 2 rows: rank 1's 1 row plus this worker's 1 row still in prefill makes 2.
            assert not decode_full(r, 500, rows=2)
            assert decode_full(r, 500, rows=2, pending=1)
            # This worker's hand-offs in flight to rank 1 count when above what it published.
            r.inflight = {1: {"row-a": None, "row-b": None, ("received", "x"): None}}
            assert decode_full(r, 500, rows=2)
            r.inflight = {}
            # Rank 1 lost (not live): only rank 0, full at 4 rows, is left.
            r.live.discard(1)
            assert decode_full(r, 500, rows=4)
            # No rank live (every one lost): full, the prefill worker serves its rows itself.
            r.live.clear()
            assert decode_full(r, 500, rows=100)
        finally:
            r.close()
    asyncio.run(go())


def test_a_row_mostly_prefill_stays_on_its_prefill_worker():
    """The length half of the rule (pools.elastic_prompt_per_output, default 10): by hand, 64 new
    tokens allow a prompt of up to 640 tokens to be handed off; 2 samples of 64, up to 1,280; a
    row's own sampling counts; 0 turns it off."""
    from pipeline.config import SamplingConfig, compose
    from pipeline.io.prompts import Prompt
    from pipeline.roles.elastic import mostly_prefill

    cfg = compose(["+job=summarize", "pools.elastic=true", "job.sampling.max_new_tokens=64"])

    def row(tokens: int, sampling=None) -> Prompt:
        p = Prompt(row=0, row_key="r", token_ids=list(range(tokens)))
        p.sampling = sampling
        return p

    assert not mostly_prefill(cfg, row(640)) and mostly_prefill(cfg, row(641))
    assert not mostly_prefill(cfg, row(1280, SamplingConfig(max_new_tokens=64, n=2, temperature=1.0)))
    assert mostly_prefill(cfg, row(641, SamplingConfig(max_new_tokens=64)))
    assert mostly_prefill(cfg, row(200, SamplingConfig(max_new_tokens=8)))  # 200 > 80
    off = compose(["+job=summarize", "pools.elastic=true", "pools.elastic_prompt_per_output=0"])
    assert not mostly_prefill(off, row(100000))


def test_a_row_waits_for_a_full_decode_pool_before_its_prefill_worker_serves_it(tmp_path):
    """pools.elastic_wait_s: a row finding every decode rank full waits that long for room (a
    rank frees a row every few seconds on decode-heavy work) before the prefill worker's own
    engine takes it; room in that time sends it to a hand-off. A row mostly prefill, or one with
    no decode rank left alive, is served there at once. Real run directory and router; the
    worker's engine is not needed to decide (the hand-off object carries only the router)."""
    import time
    from types import SimpleNamespace

    from pipeline.config import compose
    from pipeline.io.prompts import Prompt
    from pipeline.roles.elastic import ElasticPrefill

    cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true",
                   "pools.elastic_prefer=handoff", "pools.elastic_wait_s=0.3",
                   "pools.elastic_decode_rows=4", "job.sampling.max_new_tokens=64"])
    run = RunDir(tmp_path)
    run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=4, kv_tokens_inflight=1000)
    row = Prompt(row=0, row_key="r", token_ids=list(range(100)))  # 100 <= 10 x 64: handed off
    long_row = Prompt(row=1, row_key="s", token_ids=list(range(700)))  # 700 > 640: mostly prefill

    async def go():
        r = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            e = ElasticPrefill(cfg, SimpleNamespace(router=r), local=None)
            here, since = e.here(row, 164, None)  # full (4 rows): waits, from now
            assert not here and since is not None
            assert e.here(row, 164, since) == (False, since)  # still within 0.3 s
            assert e.here(long_row, 764, None) == (True, None)  # mostly prefill: at once
            time.sleep(0.35)
            assert e.here(row, 164, since) == (True, since)  # full for 0.3 s: served here
            time.sleep(0.01)
            run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=3, kv_tokens_inflight=900)
            r._refresh()
            assert e.here(row, 164, since) == (False, None)  # room: handed off
            r.live.clear()  # every decode rank lost: served here at once
            assert e.here(row, 164, None)[0]
        finally:
            r.close()
    asyncio.run(go())


def test_a_prefill_worker_claims_its_next_unit_only_when_a_row_of_it_could_start(tmp_path):
    """ElasticPrefill.room, the worker's keep_claiming (by ElasticPrefill.places): a row places free in all (the worker's 2 x
    batch_rows) is not enough; the new unit's rows must be able to start at once, by the rule
    they will meet (handed off while a decode rank has room, here while every rank is full), else
    the unit waits for a worker or a decode rank that can start it. Measured on the test Slurm
    before: a unit claimed with every hand-off and local place taken waited 18 s while another
    worker idled. Real run directory and router; expected answers by hand in the comments."""
    from types import SimpleNamespace

    from pipeline.config import compose
    from pipeline.roles.elastic import ElasticPrefill

    cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true",
                   "pools.elastic_prefer=handoff", "pools.elastic_wait_s=0",
                   "pools.elastic_decode_rows=8", "job.batch_rows=4", "job.sampling.max_new_tokens=64",
                   "pools.elastic_claim_wait_s=0"])
    run = RunDir(tmp_path)
    run.create(cfg, list_shards(str(SAMPLE)), str(tmp_path / "out"), 24)
    run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=1, kv_tokens_inflight=100)

    async def go():
        r = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            e = ElasticPrefill(cfg, SimpleNamespace(router=r), local=None)
            e.last_need = 164

            def handing_off(n: int) -> None:  # n rows handed off, each in flight at rank 0
                e.handing_off, r.inflight = n, {0: {f"row-{i}": None for i in range(n)}}

            # 4 hand-offs in flight (every hand-off place, batch_rows 4); rank 0 decodes
            # max(1 published, 4 in flight) = 4 < 8 rows: room, so a new row would be handed off
            # and wait for a place: no claim, though no row is served here (4 local places).
            handing_off(4)
            assert not e.places() > 0
            handing_off(3)  # a hand-off place free, the rank has room
            assert e.places() > 0
            # The rank full (8 rows): a new row is served here, while a local place is free.
            run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=8, kv_tokens_inflight=900)
            r._refresh()
            e.serving_here = 4
            assert not e.places() > 0
            e.serving_here = 3
            assert e.places() > 0
            e.waiting = 1  # a row of this worker already waits: its unit first
            assert not e.places() > 0
            e.waiting = 0
            # Room at the rank again, hand-off places full: the last row mostly prefill means
            # the next is likely served here too, so the local place counts.
            run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=1, kv_tokens_inflight=100)
            r._refresh()
            handing_off(4)
            e.last_here = True
            assert e.places() > 0
            e.last_here = False
            # This engine serves 3 rows of its own and the rank has room: no claim to hand off
            # (the rank's room would wait on a prefill beside those rows: the rank claims).
            handing_off(3)
            assert not e.places() > 0
            # room() waits while no row could start and returns once one could.
            handing_off(4)
            e.serving_here = 0
            waiter = asyncio.create_task(e.room())
            await asyncio.sleep(0.4)
            assert not waiter.done()
            handing_off(3)
            await asyncio.wait_for(waiter, 0.5)
        finally:
            r.close()
    asyncio.run(go())


def test_a_unit_is_claimed_with_places_for_all_its_rows_or_some_for_claim_wait_s(tmp_path):
    """pools.elastic_claim_wait_s (ClaimGate), both sides: a prefill worker (ElasticPrefill.room)
    and a decode rank (ElasticDecode.has_room) claim a unit at once when all of its rows could
    start, and with places for only some of them once that has lasted elastic_claim_wait_s, so
    that one with places for all of it takes it first. Measured before (test Slurm, capped,
    decode-heavy 2P:2D): the last two units went to a worker with one place each, the other
    worker's 4 places freed 1.5 s later and it idled 36 s. The sample's 24 rows in its 3 shards:
    units of 8 rows; places worked out by hand in the comments."""
    import time
    from types import SimpleNamespace

    from pipeline.config import compose
    from pipeline.roles.elastic import ElasticDecode, ElasticPrefill
    from pipeline.roles.work import ClaimGate, unit_rows
    from pipeline.runtime.heartbeat import Heartbeat

    cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true",
                   "pools.elastic_prefer=handoff", "pools.elastic_wait_s=0",
                   "pools.elastic_decode_rows=6", "job.batch_rows=4", "job.sampling.max_new_tokens=64",
                   "pools.elastic_claim_wait_s=0.4", "pools.elastic_idle_s=0"])
    run = RunDir(tmp_path)
    run.create(cfg, list_shards(str(SAMPLE)), str(tmp_path / "out"), 24)
    assert unit_rows(run) == 8  # 24 rows / 3 units

    def ranks(d0: int, d1: int) -> None:  # what ranks 0 and 1 published: rows decoding
        run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=d0, kv_tokens_inflight=100)
        run.publish_decode(1, "tcp://127.0.0.1:21001", "decode-1@x", 8192, decoding=d1, kv_tokens_inflight=100)

    async def claimed_within(e: ElasticPrefill, s: float) -> bool:
        waiter = asyncio.create_task(e.room())
        try:
            await asyncio.wait_for(asyncio.shield(waiter), s)
            return True
        except asyncio.TimeoutError:
            waiter.cancel()
            return False

    async def go():
        ranks(5, 6)
        r = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            e = ElasticPrefill(cfg, SimpleNamespace(router=r), local=None)
            e.last_need = 164
            # Rank 0 has 6 - 5 = 1 row free, rank 1 none; this engine serves no row: 1 hand-off,
            # then the ranks full, 4 here: 5 places of the 8 wanted (min(8 rows, 2 x 4 places)).
            assert e.places() == 5
            assert not await claimed_within(e, 0.25)  # a worker with room for all of it first
            started = time.monotonic()
            assert await claimed_within(e, 1.0)  # ... for 0.4 s, then this one
            assert time.monotonic() - started >= 0.1
            # Ranks with 6 - 2 + 6 - 0 = 10 free rows: this worker's 4 hand-off places, the
            # rest of the rows waiting for one (the ranks not full): 4 places.
            ranks(2, 0)
            r._refresh()
            assert e.places() == 4
            # 2 + 2 rows free at the ranks, this engine empty: 4 hand-offs and 4 here, 8: at once.
            ranks(4, 4)
            r._refresh()
            e.serving_here = 0
            assert e.places() == 8
            assert await claimed_within(e, 0.2)
            e.waiting = 1  # a row of this worker waits: no place
            assert e.places() == 0
            e.waiting = 0
            # This engine serving a row of its own while the ranks have room: no claim (a rank
            # claims a unit itself rather than wait for a prefill on a busy engine) ...
            e.serving_here = 1
            assert e.places() == 0
            # ... but with the ranks full, its 4 - 1 = 3 places here.
            ranks(6, 6)
            r._refresh()
            assert e.places() == 3
        finally:
            r.close()

    class Rank(ElasticDecode):  # the attributes DecodeServer gives the mixin
        def __init__(self):
            self.cfg, self.run = cfg, run
            self.capacity, self.serving, self.handoff_kv, self.expected = 8192, {}, {}, {}
            self.gate = ClaimGate(cfg.pools.elastic_claim_wait_s)
            self.beating = Heartbeat(lambda: None, 2.0, "test-beat")  # poked, never started

    d = Rank()
    assert d.has_room()  # 6 rows free of 6, for a unit of min(8, 6): at once
    d.own_rows = 2  # 4 places of 6 wanted: not yet, then after 0.4 s
    assert not d.has_room()
    time.sleep(0.45)
    assert d.has_room()
    d.own_rows = 6  # full
    assert not d.has_room()
    asyncio.run(go())


def test_a_decode_rank_claims_units_only_while_no_hand_off_reaches_it():
    """pools.elastic_idle_s: a decode rank claims a unit only after that long neither full nor
    sent a hand-off: while the prefill pool feeds it, its room is theirs."""
    import time

    from pipeline.config import compose
    from pipeline.roles.elastic import ElasticDecode
    from pipeline.runtime.heartbeat import Heartbeat

    class Rank(ElasticDecode):  # the attributes DecodeServer gives the mixin
        def __init__(self):
            self.cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true",
                                "pools.elastic_idle_s=0.3", "pools.elastic_decode_rows=4"])
            self.capacity, self.serving, self.handoff_kv, self.expected = 8192, {}, {}, {}
            self.full_at = time.monotonic()
            self.beating = Heartbeat(lambda: None, 2.0, "test-beat")  # poked, never started: nothing published

    async def go():
        d = Rank()
        assert not d.has_room()  # just started: not yet 0.3 s
        await asyncio.sleep(0.35)
        assert d.has_room()
        task = asyncio.create_task(asyncio.sleep(0.5))
        d.serving["h1"] = task  # as DecodeServer._track: counted until its task ends
        task.add_done_callback(lambda _: d.serving.pop("h1"))
        d.count_handoff("h1", 500, task)  # a hand-off arrives: 1 row of 4, not full
        assert not d.is_full() and not d.has_room()
        await asyncio.sleep(0.35)  # 0.3 s since it arrived, still decoding: room again
        assert d.has_room()
        d.own_rows = 3  # with 3 rows of its own units: 4 rows, full
        assert d.is_full() and not d.has_room()
        await asyncio.sleep(0.35)  # full all along, though nothing asked since
        await task  # the hand-off ends: 3 rows, not full, and full until this moment ...
        await asyncio.sleep(0)  # (its done-callback)
        assert not d.is_full() and not d.has_room()  # ... so no claim before 0.3 s from now
        await asyncio.sleep(0.35)
        assert d.has_room()
    asyncio.run(go())


def test_a_decode_ranks_published_load_follows_its_rows_within_half_a_second(tmp_path):
    """What a decode rank decodes reaches the run directory when it changes, not at the next
    2 s beat: prefill workers route by it, and one reading a beat from before the ranks'
    first claims sent them its rows (test Slurm, decode-heavy 1P:3D). A real heartbeat thread
    (every 2 s) writing the rank's endpoint record, read back from the file."""
    import json
    import time

    from pipeline.config import compose
    from pipeline.roles.elastic import ElasticDecode
    from pipeline.runtime.heartbeat import Heartbeat

    run = RunDir(tmp_path)

    class Rank(ElasticDecode):  # the attributes DecodeServer gives the mixin
        def __init__(self):
            self.cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true"])
            self.capacity, self.serving, self.handoff_kv, self.expected = 8192, {}, {}, {}
            self.beating = Heartbeat(lambda: run.publish_decode(0, "tcp://127.0.0.1:1", "decode-0@x", 8192,
                                                                **self.load()), 2.0, "test-beat").start()

    def published() -> int:
        return json.loads((tmp_path / "decode" / "rank-0.json").read_text())["decoding"]

    async def go():
        d = Rank()
        try:
            await asyncio.sleep(2.1)  # the first beat: nothing decoding
            assert published() == 0
            task = asyncio.create_task(asyncio.sleep(0.8))
            d.serving["h1"] = task
            d.count_handoff("h1", 500, task)
            t = time.monotonic()
            while published() != 1:
                await asyncio.sleep(0.02)
            assert time.monotonic() - t < 0.5  # not the next beat, 1.9 s away
            await task
            d.serving.clear()
            t = time.monotonic()
            while published() != 0:  # and when it ends
                await asyncio.sleep(0.02)
            assert time.monotonic() - t < 0.5
        finally:
            d.beating.stop()
    asyncio.run(go())


def test_a_row_for_a_busy_prefill_worker_goes_to_a_rank_with_kv_room_rather_than_wait(tmp_path):
    """ElasticPrefill.overflows: a row for the prefill worker's own engine (every decode rank full
    by rows) that finds every place there taken is handed off all the same while a rank's KV
    cache has room for it; it waits only when the KV caches are full too, and a row mostly
    prefill never overflows. Measured before (test Slurm, nodes capped at 0.5 cores): 4 rows
    waited 28 s on busy workers and made the run's last wave. Real run directory and router;
    expected answers by hand in the comments."""
    from types import SimpleNamespace

    from pipeline.config import compose
    from pipeline.io.prompts import Prompt
    from pipeline.roles.elastic import ElasticPrefill

    cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true",
                   "pools.elastic_prefer=handoff", "pools.elastic_wait_s=0",
                   "pools.elastic_decode_rows=4", "job.batch_rows=4", "job.sampling.max_new_tokens=64"])
    run = RunDir(tmp_path)
    # Rank 0: full by rows (4 >= 4), 1,000 of its 8,192 KV tokens taken.
    run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=4, kv_tokens_inflight=1000)
    row = Prompt(row=0, row_key="r", token_ids=list(range(100)))  # 100 + 64 = 164 KV tokens
    long_row = Prompt(row=1, row_key="s", token_ids=list(range(700)))  # 700 > 10 x 64: mostly prefill

    async def go():
        r = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            e = ElasticPrefill(cfg, SimpleNamespace(router=r), local=None)
            assert e.here(row, 164, None)[0]  # every rank full by rows: for this engine
            e.serving_here = 3
            assert not e.overflows(row, 164)  # a place here is free: served here
            e.serving_here = 4
            assert e.overflows(row, 164)  # no place here; 1,000 + 164 <= 8,192: handed off
            assert not e.overflows(long_row, 764)  # mostly prefill: waits for a place here
            # KV full too: 8,100 + 164 > 8,192, so the row waits for a place.
            run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=4, kv_tokens_inflight=8100)
            r._refresh()
            assert not e.overflows(row, 164)
            r.live.clear()  # no rank alive: nothing to hand off to
            assert not e.overflows(row, 164)
        finally:
            r.close()
    asyncio.run(go())
