"""What a claim costs (issue #39): a worker's claims over a run look at each unit about once, not
once per unit per claim, and still see what other workers did.

``tools/bench_scale.py claims`` measured 500 units taken by 4 claimant processes in 64.9 s before
(every claim listed and read the whole claims folder and every done marker, and each unit parsed
``config.yaml``), 0.4 s after.
"""

from __future__ import annotations

import os

from pipeline.config import compose
from pipeline.io.shards import Shard
from pipeline.roles.work import next_unit
from pipeline.runtime.claims import Claims
from pipeline.runtime.rundir import RunDir


def _counting_listdir(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = os.listdir

    def listdir(path="."):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    return calls


def test_claims_after_the_first_do_not_list_the_folder_and_see_other_workers(tmp_path, monkeypatch):
    a, b = Claims(tmp_path, "w-a"), Claims(tmp_path, "w-b")
    assert a.claim_next(range(100)) == 0
    calls = _counting_listdir(monkeypatch)
    taken_a, taken_b = [0], []
    for _ in range(40):
        taken_b.append(b.claim_next(range(100), exclude=taken_b))
        taken_a.append(a.claim_next(range(100), exclude=taken_a))
    # b listed the folder once (its first call), a never again: 81 claims, 1 listing.
    assert len(calls) == 1, calls
    assert sorted(taken_a + taken_b) == list(range(81))  # each unit once, in order
    assert all(a.holds(i) for i in taken_a) and not any(a.holds(i) for i in taken_b)


def test_holds_sees_a_takeover_and_settled_is_asked_only_of_the_unit_taken(tmp_path, monkeypatch):
    a = Claims(tmp_path, "w-a")
    assert a.claim_next(range(10)) == 0
    assert a.holds(0)
    taker = Claims(tmp_path, "w-b", dead_after_s=0.0)
    taker._seen["w-a"] = (None, -1e9)  # w-a's heartbeat was seen long ago and never changed: dead
    assert taker.claim(0)
    calls = _counting_listdir(monkeypatch)
    assert not a.holds(0) and taker.holds(0)  # generation 1 names w-b
    assert calls == []
    asked: list[int] = []

    def settled(i: int) -> bool:
        asked.append(i)
        return i in (1, 2)

    assert a.claim_next(range(10), exclude={0}, is_settled=settled) == 3
    assert asked == [1, 2, 3]
    assert a.claim_next(range(10), exclude={0, 3}, is_settled=settled) == 4
    assert asked == [1, 2, 3, 4]  # 1 and 2 stay settled: not asked again


def _run(tmp_path, shards: int) -> tuple[RunDir, list[Shard]]:
    run = RunDir(tmp_path / "run")
    sh = [Shard(index=i, url=str(tmp_path / f"part-{i}.parquet"), name=f"part-{i}.parquet") for i in range(shards)]
    run.create(compose(["+job=summarize", "pools=colocated"]), sh, str(tmp_path / "out"), rows=shards)
    return run, sh


def test_next_unit_skips_shards_done_or_failed_by_anyone(tmp_path):
    run, shards = _run(tmp_path, 5)
    run.mark_done(shards[0], {"rows": 1})
    run.mark_failed(shards[2], "OSError: gone", "w-x")
    claims = Claims(run.path, "w-a")
    units = run.units()
    by = {s.index: s for s in shards}
    got = []
    while (i := next_unit(run, claims, units, by, None, got)) is not None:
        got.append(i)
    assert got == [1, 3, 4]


def test_run_dir_reads_shards_json_once_and_again_when_it_is_replaced(tmp_path):
    run, shards = _run(tmp_path, 3)
    # sample_lists, output_dir, shards and units come from shards.json alone: config.yaml is not
    # parsed (it was, once per unit, 0.1 s each, for sample_lists' default).
    (run.path / "config.yaml").write_text("::: not yaml")
    assert run.sample_lists() is False and run.output_dir() == str(tmp_path / "out")
    assert [s.name for s in run.shards()] == [s.name for s in shards] and len(run.units()) == 3
    other = RunDir(run.path)
    other.create(compose(["+job=summarize", "pools=colocated"]), shards[:2], str(tmp_path / "out2"), rows=2)
    # Another process's launch replaced shards.json: this RunDir sees the new one.
    assert len(run.shards()) == 2 and run.output_dir() == str(tmp_path / "out2") and run.total_rows() == 2
