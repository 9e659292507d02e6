"""The shard owner writes each row's own result in input order, whatever order rows start and
finish in: rows resumed from a checkpoint (not a prefix of the shard) start first, and served rows
finish out of order. No engine: the serve function answers each row with its own text's first
word after a delay that reverses the finishing order, and the expected values come from the
input rows themselves."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import compose
from pipeline.engine.model import load_tokenizer
from pipeline.io.checkpoint import RowCheckpoint
from pipeline.io.output import served_row
from pipeline.io.shards import list_shards
from pipeline.roles.work import own_shards
from pipeline.runtime.claims import Claims
from pipeline.runtime.rundir import RunDir

N = 12
RESUMED = (1, 4, 5, 9)


def test_each_row_gets_its_own_result_in_input_order(tmp_path):
    words = [f"word{i}" for i in range(N)]  # each row's text
    inp = tmp_path / "input"
    inp.mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(N)], "text": words}), inp / "s.parquet")
    run_dir = tmp_path / "run"
    cfg = compose(["+job=summarize", f"job.input={inp}", f"run.dir={run_dir}", "job.checkpoint_rows=1"])
    shards = list_shards(str(inp))
    run = RunDir(run_dir)
    run.create(cfg, shards, str(run_dir / "output"), N)
    tokenizer = load_tokenizer(cfg)

    # An earlier attempt finished rows RESUMED (its checkpoint holds them, not a prefix).
    async def resume() -> None:
        checkpoint = RowCheckpoint(run.checkpoint_dir(shards[0]), 1)
        for row in RESUMED:
            await checkpoint.add(row, served_row(text=f"resumed {words[row]}", token_ids=[1], finish_reason="stop",
                                                 error=None, token_times=[0.0], prefill_start=0.0, prefill_end=None,
                                                 prefill_worker="earlier-0"))
    asyncio.run(resume())

    async def serve(p):  # the row's own word, later rows finishing first
        await asyncio.sleep(0.01 * (N - p.row))
        text = tokenizer.decode(p.token_ids)
        word = max((w for w in words if w in text), key=len)  # word1 is in word10: the longest
        return served_row(text=word, token_ids=[1], finish_reason="stop", error=None, token_times=[0.0],
                          prefill_start=0.0, prefill_end=None, prefill_worker="test-0")

    asyncio.run(own_shards(run, cfg, Claims(run.path, "test-0"), "test-0", tokenizer, serve))
    out = pq.read_table(run_dir / "output" / "s.parquet").to_pylist()
    assert [r["id"] for r in out] == [f"r{i}" for i in range(N)], out
    assert all(r["error"] is None for r in out), [r["error"] for r in out]
    assert [r["generation"] for r in out] == [f"resumed {w}" if i in RESUMED else w for i, w in enumerate(words)]
