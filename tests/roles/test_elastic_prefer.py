"""``pools.elastic_prefer=local`` (the default; issue #40): a prefill worker serves its rows in
its own engine while it has a place, hands off a row only when every place there is taken and no
unit is left to claim (to a decode rank below its row cap whose KV cache has room), and claims a unit only for its own places, leaving a
decode rank with room to claim one itself. Measured before, with hand-offs first (test Slurm,
decode-heavy, nodes capped at half a core): an idle prefill worker handed a unit off and then
prefilled a unit of its own beside it, and ended 20-26 s after every other engine.

The decode ranks are endpoint records in a real run directory, written by
:meth:`RunDir.publish_decode` as a decode rank's heartbeat writes them, read by a real
:class:`DecodeRouter`; the two ways a row can go (this engine, a hand-off) are stand-ins that
record the row and wait until the test lets them end; each expected answer is worked out by hand
in the comments."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pipeline.config import compose
from pipeline.io.prompts import Prompt
from pipeline.io.shards import list_shards
from pipeline.roles.elastic import ElasticPrefill
from pipeline.roles.router import DecodeRouter
from pipeline.runtime.rundir import RunDir
from tests.helpers import SAMPLE


def test_a_prefill_worker_serves_its_rows_itself_and_hands_off_only_what_overflows(tmp_path):
    cfg = compose(["+job=summarize", "pools=disaggregated", "pools.elastic=true", "pools.elastic_decode_rows=4",
                   "job.batch_rows=2", "job.sampling.max_new_tokens=64", "pools.elastic_claim_wait_s=0"])
    assert cfg.pools.elastic_prefer == "local"  # the default
    run = RunDir(tmp_path)
    run.create(cfg, list_shards(str(SAMPLE)), str(tmp_path / "out"), 24)
    # Rank 0: idle (0 rows of 4, 0 of its 8,192 KV tokens): room for every row below.
    run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=0, kv_tokens_inflight=0)
    rows = [Prompt(row=i, row_key=f"r{i}", token_ids=list(range(100))) for i in range(4)]  # 164 KV tokens each
    went: dict[str, str] = {}
    release = asyncio.Event()

    async def way(name: str, p: Prompt):
        went[p.row_key] = name
        await release.wait()
        return name

    async def go():
        r = DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)
        try:
            left = [True]  # a unit of the run is still unclaimed
            e = ElasticPrefill(cfg, SimpleNamespace(router=r, serve=lambda p: way("handoff", p)),
                               local=lambda p: way("here", p), units_left=lambda: left[0])
            e.last_need = 164
            # Idle, with the rank's room: both of this engine's places (batch_rows 2) count, and
            # only they (not the rank's 4 free rows: the rank claims a unit itself).
            assert e.places() == 2
            # Two rows: both here, though the rank has room.
            served = [asyncio.create_task(e.serve(p)) for p in rows[:2]]
            await asyncio.sleep(0.1)
            assert went == {"r0": "here", "r1": "here"}
            # Every place here taken: no claim, whatever room the rank has.
            assert e.places() == 0
            # A third row finds every place here taken. While a unit is left to claim, it waits
            # (the rank with room claims that unit itself); once none is, it overflows: 0 + 164
            # <= 8,192 KV tokens at rank 0, below its cap, so it is handed off.
            served.append(asyncio.create_task(e.serve(rows[2])))
            await asyncio.sleep(0.3)
            assert "r2" not in went and e.waiting == 1
            left[0] = False
            await asyncio.sleep(0.7)  # a waiting row decides again every 0.5 s
            assert went["r2"] == "handoff"
            # The rank at its row cap (4 rows: its own unit's), its KV cache with room (1,000 +
            # 164 <= 8,192): the fourth row waits for a place here, as it does with the KV cache
            # full (8,100 + 164 > 8,192) below the cap.
            run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=4, kv_tokens_inflight=1000)
            r._refresh()
            assert not e.overflows(rows[3], 164)
            run.publish_decode(0, "tcp://127.0.0.1:21000", "decode-0@x", 8192, decoding=1, kv_tokens_inflight=8100)
            r._refresh()
            served.append(asyncio.create_task(e.serve(rows[3])))
            await asyncio.sleep(0.3)
            assert "r3" not in went and e.waiting == 1
            release.set()  # the rows end; the waiting row takes a freed place here
            assert await asyncio.wait_for(asyncio.gather(*served), 2) == ["here", "here", "handoff", "here"]
            assert went["r3"] == "here"
            # room(): the next unit (4 rows) is claimed with both places free (want: batch_rows,
            # the unit's rows beyond them overflow), not waiting for 4.
            await asyncio.wait_for(e.room(), 1)
        finally:
            r.close()
    asyncio.run(go())
