"""Work units served through claims (pipeline.roles.work) with the real shard owner and no
engine: the serve function answers each row with its own text, so the expected output is the
input itself, and a split run is compared row for row with an unsplit run of the same input.

- A big shard split into row-group parts, served by two workers at once: both serve parts of it,
  and the output shard equals the unsplit run's, row for row, with one done marker whose totals
  are the shard's.
- The assembly lost mid-way (its claimant dead before it wrote anything): the next worker to
  look assembles the shard from the parts, and the output is the same.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import compose
from pipeline.engine.model import load_tokenizer
from pipeline.io.output import served_row
from pipeline.io.shards import list_shards
from pipeline.io.units import plan_units
from pipeline.roles.work import own_shards
from pipeline.runtime.claims import Claims
from pipeline.runtime.rundir import RunDir

BIG, SMALL = 20, 3  # rows; the big shard has row groups of 4 rows
KEPT = ["id", "generation", "error", "finish_reason", "prompt_tokens", "output_tokens"]


def _input(folder: Path) -> list[str]:
    folder.mkdir()
    words = [f"big{i:02d}" for i in range(BIG)] + [f"small{i}" for i in range(SMALL)]
    pq.write_table(pa.table({"id": [f"b{i}" for i in range(BIG)], "text": words[:BIG]}), folder / "a.parquet",
                   row_group_size=4)
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(SMALL)], "text": words[BIG:]}), folder / "b.parquet")
    return words


def _run(tmp_path: Path, name: str, unit_rows: int | None, workers: list[str], words: list[str],
         ghost_assembler: bool = False) -> RunDir:
    inp = tmp_path / "input"
    run_dir = tmp_path / name
    cfg = compose(["+job=summarize", f"job.input={inp}", f"run.dir={run_dir}", "job.batch_rows=2",
                   "job.checkpoint_rows=2", f"job.unit_rows={unit_rows if unit_rows else 'null'}"])
    shards = list_shards(str(inp))
    run = RunDir(run_dir)
    run.create(cfg, shards, str(run_dir / "output"), BIG + SMALL, units=plan_units(shards, [BIG, SMALL], unit_rows))
    if ghost_assembler:  # a worker that claimed the big shard's assembly and then died
        Claims(run.path, "ghost").claim(len(run.units()) + 0)
    shared = load_tokenizer(cfg)
    failed: dict[str, BaseException] = {}

    def worker(name: str) -> None:
        # Its own tokenizer, as each worker process has: one tokenizer used from two threads at
        # once rendered some prompts with other tokens here.
        tokenizer = copy.deepcopy(shared)

        async def serve(p):
            await asyncio.sleep(0.02)
            text = tokenizer.decode(p.token_ids)
            word = next(w for w in words if w in text)
            return served_row(text=word, token_ids=[1], finish_reason="stop", error=None, token_times=[0.0],
                              prefill_start=0.0, prefill_end=None, prefill_worker=name)

        try:
            asyncio.run(own_shards(run, cfg, Claims(run.path, name), name, tokenizer, serve))
        except BaseException as exc:  # a thread's exception is only printed: keep it for the test
            failed[name] = exc
            raise

    threads = [threading.Thread(target=worker, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # Each worker returned on its own (nothing left to claim), as a worker process exits: not
    # still running, and not ended by an exception, whatever the output looks like.
    assert [t.name for t in threads if t.is_alive()] == [], "workers still running after 120 s"
    assert failed == {}, failed
    return run


def test_a_big_shard_split_in_parts_gives_the_unsplit_output(tmp_path):
    words = _input(tmp_path / "input")
    whole = _run(tmp_path, "whole", None, ["colocated-0"], words)
    split = _run(tmp_path, "split", 8, ["colocated-0", "colocated-1"], words)
    assert len(split.units()) == 4  # a.parquet in 3 parts (rows 0-7, 8-15, 16-19), b.parquet whole
    for name in ("a.parquet", "b.parquet"):
        a = pq.read_table(whole.path / "output" / name)
        b = pq.read_table(split.path / "output" / name)
        assert a.schema == b.schema
        assert a.select(KEPT).to_pylist() == b.select(KEPT).to_pylist()
    assert [r["generation"] for r in pq.read_table(split.path / "output" / "a.parquet").to_pylist()] == words[:BIG]
    marker = split.done()["a.parquet"]
    assert marker["rows"] == BIG and marker["errors"] == 0 and len(marker["parts"]) == 3
    # Both workers served parts of the big shard.
    served_by = {r["prefill_worker"] for r in pq.read_table(split.path / "output" / "a.parquet").to_pylist()}
    assert served_by == {"colocated-0", "colocated-1"}, served_by
    assert not (split.path / "parts" / "a.parquet").exists()  # parts removed once assembled


def test_an_assembly_lost_mid_way_is_done_by_the_next_worker(tmp_path):
    words = _input(tmp_path / "input")
    run = _run(tmp_path, "run", 8, ["colocated-0"], words, ghost_assembler=True)
    assert "a.parquet" not in run.done() and "b.parquet" in run.done()  # parts written, nobody assembled
    assert not (run.path / "output" / "a.parquet").exists()
    later = Claims(run.path, "colocated-1", dead_after_s=0.0)
    assert later.alive("ghost")  # first look
    deadline = time.monotonic() + 5
    while later.alive("ghost"):  # dead once this clock has moved on from the first look
        assert time.monotonic() < deadline, "the ghost never counted as dead"
    tokenizer = load_tokenizer(run.config())

    async def serve(p):
        raise AssertionError("nothing is left to serve")

    asyncio.run(own_shards(run, run.config(), later, "colocated-1", tokenizer, serve))
    out = pq.read_table(run.path / "output" / "a.parquet").to_pylist()
    assert [(r["id"], r["generation"]) for r in out] == [(f"b{i}", words[i]) for i in range(BIG)]
    assert run.done()["a.parquet"]["rows"] == BIG
