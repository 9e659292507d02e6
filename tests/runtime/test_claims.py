"""Shard claims (pipeline.runtime.claims), without engines.

- Many claimant processes at once over one claims folder, some killed with SIGKILL while they
  hold claims: every unit is completed exactly once (a completion is an exclusive create, so a
  second completion of a unit is caught, not overwritten), and the killed claimants' units are
  taken over by the survivors.
- The shard owner with claims over skewed shards: two workers, one big shard and three small
  ones; the worker that drew the big shard serves only it, the other serves all three small
  ones (a fixed group, today's ``index mod 2``, would have given the big shard's worker a small
  one too), and every output row is its own input row's.
"""

from __future__ import annotations

import asyncio
import copy
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.runtime.claims import Claims, LiveWorkers, heartbeats

UNITS = 60
CLAIMANTS = 8
KILLED = (1, 4, 6)


def _claimant(run: str, worker: str, units: int, work_s: float) -> None:
    """Claim units until every unit is complete; completing one is an exclusive create of
    ``completed/UNIT``, and a second completion of the same unit is recorded in ``doubles/``."""
    claims = Claims(run, worker, dead_after_s=1.0).start_heartbeat(every_s=0.1)
    completed = Path(run) / "completed"
    while True:
        done = {int(p.name) for p in completed.iterdir()}
        if len(done) == units:
            return
        unit = claims.claim_next(range(units), done)
        if unit is None:
            time.sleep(0.05)  # the rest is held by live claimants, or by dead ones not yet known dead
            continue
        time.sleep(work_s)
        try:
            fd = os.open(completed / str(unit), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, worker.encode())
            os.close(fd)
        except FileExistsError:
            (Path(run) / "doubles" / f"{unit}-{worker}").touch()


def test_many_claimants_some_killed_complete_every_unit_exactly_once(tmp_path):
    (tmp_path / "completed").mkdir()
    (tmp_path / "doubles").mkdir()
    ctx = mp.get_context("fork")
    # The claimants to be killed are slow: each still holds its first unit, not completed, when killed.
    procs = [ctx.Process(target=_claimant, args=(str(tmp_path), f"w{i}", UNITS, 0.02 if i not in KILLED else 60))
             for i in range(CLAIMANTS)]
    for p in procs:
        p.start()
    # Kill them once each holds its first unit (they hold it for 60 s): wait for that itself.
    killed = {f"w{i}" for i in KILLED}
    deadline = time.monotonic() + 60
    while True:
        held = Claims(tmp_path, "observer").holders()
        if killed <= {w for _, w in held.values()}:
            break
        assert time.monotonic() < deadline, f"the slow claimants claimed nothing within 60 s: {held}"
        time.sleep(0.01)
    for i in KILLED:
        os.kill(procs[i].pid, signal.SIGKILL)
    for p in procs:
        p.join(timeout=60)
    assert not any(p.is_alive() for p in procs), "claimants still running after 60 s"
    completed = {int(p.name): p.read_text() for p in (tmp_path / "completed").iterdir()}
    assert sorted(completed) == list(range(UNITS))
    assert not list((tmp_path / "doubles").iterdir()), "units completed twice"
    # The killed claimants held units they never completed; survivors took them over.
    orphaned = {u for u, (_, w) in held.items() if w in {f"w{i}" for i in KILLED}} - {
        u for u, w in completed.items() if w in {f"w{i}" for i in KILLED}}
    assert orphaned, held
    assert all(completed[u] not in {f"w{i}" for i in KILLED} for u in orphaned)
    after = Claims(tmp_path, "observer").holders()
    assert all(after[u][0] >= 1 for u in orphaned), after  # a later generation: taken over


def test_a_requeued_worker_resumes_its_own_claim_and_a_limit_caps_its_claims(tmp_path):
    a = Claims(tmp_path, "prefill-0")
    assert a.claim_next(range(4)) == 0
    b = Claims(tmp_path, "prefill-1")
    assert b.claim_next(range(4), limit=1) == 1
    assert b.claim_next(range(4), limit=1, exclude={1}) is None  # holds one already
    requeued = Claims(tmp_path, "prefill-0")  # same worker id, a new process
    assert requeued.claim_next(range(4)) == 0
    assert requeued.claim_next(range(4), settled={0}) == 2
    assert a.holds(0) and not b.holds(0)
    # Units 0-2 claimed (by a, b and a): all of 3 claimed, not of 4; a watcher that saw none
    # claimed sees the claims the others made since (they are files, not its own memory).
    watcher = Claims(tmp_path, "decode-0")
    assert not watcher.all_claimed(4) and watcher.all_claimed(3) and watcher.all_claimed(0)
    assert b.claim_next(range(4), exclude={1}) == 3
    assert watcher.all_claimed(4) and not watcher.all_claimed(5)
    # A resumed run: units 5 and 6 were done in an earlier launch, so nobody claims them again;
    # settled, they are not left. Asked only of units not seen claimed or settled (4 is claimed).
    assert b.claim_next(range(5), exclude={1, 3}) == 4
    asked = []

    def settled(i: int) -> bool:
        asked.append(i)
        return i in (5, 6)

    assert not watcher.all_claimed(8, settled) and asked == [5, 6, 7]
    assert b.claim_next(range(8), exclude={1, 3, 4}, is_settled=lambda i: i in (5, 6)) == 7
    assert watcher.all_claimed(8, settled) and asked == [5, 6, 7]  # 7 seen claimed; 5 and 6 not asked again


def test_the_launcher_sees_a_worker_live_until_it_ends_or_its_heartbeat_stands_still(tmp_path):
    watcher = LiveWorkers(tmp_path, dead_after_s=0.5)
    assert watcher.live() == []
    a = Claims(tmp_path, "prefill-0").start_heartbeat(every_s=0.1)
    b = Claims(tmp_path, "prefill-1")
    b.beat()  # one beat, then nothing: killed outright
    first_look = time.monotonic()
    assert watcher.live() == ["prefill-0", "prefill-1"]
    deadline = first_look + 10
    while (live := watcher.live()) != ["prefill-0"]:
        assert live == ["prefill-0", "prefill-1"] and time.monotonic() < deadline, live
        time.sleep(0.01)
    assert time.monotonic() - first_look >= 0.5  # b's heartbeat stood still for 0.5 s of this clock
    a.stop_heartbeat()  # its last beat says it ended
    assert watcher.live() == []


def test_a_worker_another_observer_saw_lost_is_presumed_dead_until_it_beats_again(tmp_path):
    """Issue #40: a task the launcher starts to take over a lost worker's units gets the
    heartbeats the launcher judged dead (:func:`heartbeats`) and may claim that worker's units at
    once (:meth:`Claims.presume_dead`), where watching it would take ``dead_after_s``; not once
    the worker beats again."""
    lost = Claims(tmp_path, "decode-0")
    lost.beat()
    assert lost.claim_next(range(2)) == 0 and lost.claim_next(range(2), exclude={0}) == 1
    ended = Claims(tmp_path, "prefill-0")
    ended.stop_heartbeat()  # ended: not among the heartbeats
    beats = heartbeats(tmp_path)
    assert set(beats) == {"decode-0"}
    taker = Claims(tmp_path, "prefill-0")
    assert taker.claim_next(range(2)) is None  # first seen: alive for 60 s
    taker.presume_dead(beats)
    assert taker.claim_next(range(2)) == 0 and taker.holds(0)
    lost.beat()  # it was not dead after all: its heartbeat changed
    other = Claims(tmp_path, "prefill-1")
    other.presume_dead(beats)
    assert other.claim_next(range(2)) is None


def _skewed_input(folder: Path, sizes: list[int]) -> list[list[str]]:
    folder.mkdir()
    texts = []
    for s, n in enumerate(sizes):
        rows = [f"shard{s}row{i}" for i in range(n)]
        pq.write_table(pa.table({"id": [f"s{s}r{i}" for i in range(n)], "text": rows}), folder / f"part-{s}.parquet")
        texts.append(rows)
    return texts


def test_a_worker_that_frees_up_claims_the_next_shard(tmp_path):
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer
    from pipeline.io.output import served_row
    from pipeline.io.shards import list_shards
    from pipeline.roles.work import own_shards
    from pipeline.runtime.rundir import RunDir

    texts = _skewed_input(tmp_path / "input", [12, 2, 2, 2])
    words = [t for shard in texts for t in shard]
    run_dir = tmp_path / "run"
    cfg = compose(["+job=summarize", f"job.input={tmp_path / 'input'}", f"run.dir={run_dir}", "job.batch_rows=1"])
    run = RunDir(run_dir)
    run.create(cfg, list_shards(str(tmp_path / "input")), str(run_dir / "output"), len(words))
    tokenizer = load_tokenizer(cfg)
    failed: dict[str, BaseException] = {}

    def worker(claims: Claims) -> None:
        name = claims.worker
        own_tokenizer = copy.deepcopy(tokenizer)  # as each worker process has its own

        async def serve(p):
            await asyncio.sleep(0.05)
            text = tokenizer.decode(p.token_ids)
            word = max((w for w in words if w in text), key=len)  # shard0row1 is in shard0row10
            return served_row(text=word, token_ids=[1], finish_reason="stop", error=None, token_times=[0.0],
                              prefill_start=0.0, prefill_end=None, prefill_worker=name)

        try:
            asyncio.run(own_shards(run, cfg, claims, name, own_tokenizer, serve))
        except BaseException as exc:  # a thread's exception is only printed: keep it for the test
            failed[name] = exc
            raise

    claims = [Claims(run.path, "colocated-0"), Claims(run.path, "colocated-1")]
    assert [c.claim_next([i]) for i, c in enumerate(claims)] == [0, 1]  # as claim_first does: who draws the big shard
    threads = [threading.Thread(target=worker, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [t.name for t in threads if t.is_alive()] == [], "workers still running after 120 s"
    assert failed == {}, failed  # each returned by itself: nothing left to claim
    done = run.done()
    assert {name: m["worker"] for name, m in done.items()} == {
        "part-0.parquet": "colocated-0", "part-1.parquet": "colocated-1",
        "part-2.parquet": "colocated-1", "part-3.parquet": "colocated-1"}, done
    for s, rows in enumerate(texts):
        out = pq.read_table(run_dir / "output" / f"part-{s}.parquet").to_pylist()
        assert [(r["id"], r["generation"], r["error"]) for r in out] == [
            (f"s{s}r{i}", t, None) for i, t in enumerate(rows)]
