"""Row checkpoints at most once per ``job.checkpoint_interval_s`` (issue #39): a fast shard
wrote two Parquet files per ``job.checkpoint_rows`` rows, ~0.8 ms of CPU a row (BENCHMARKS.md).
No engine: rows go through the real :class:`RowCheckpoint` and its files are read back."""

from __future__ import annotations

import asyncio
import time

import pyarrow.parquet as pq

from pipeline.io.checkpoint import RowCheckpoint
from pipeline.io.output import served_row


def _row(i: int):
    return served_row(text=f"row {i}", token_ids=[i], finish_reason="stop", error=None, token_times=[0.0],
                      prefill_start=0.0, prefill_end=None, prefill_worker="test-0")


def _saved(directory) -> list[list[int]]:
    """The row indices of each checkpoint file, in the order the files were written."""
    files = sorted(directory.glob("part-*.parquet"), key=lambda f: f.stat().st_mtime_ns)
    return [pq.read_table(f).column("row").to_pylist() for f in files]


def test_rows_finishing_fast_are_saved_together_once_per_interval(tmp_path):
    records: list[list[dict]] = []
    ck = RowCheckpoint(tmp_path / "ck", 2, with_batch=records.append, interval_s=0.5)

    async def go():
        start = time.monotonic()
        for i in range(20):  # 20 rows in ~0.2 s: the first batch now, the rest in one batch 0.5 s later
            await ck.add(i, _row(i), {"row": i})
            await asyncio.sleep(0.01)
        assert [len(b) for b in _saved(tmp_path / "ck")] == [2]
        # No more rows come: the deferred save still happens, interval_s after the first.
        await asyncio.sleep(0.6 - (time.monotonic() - start))
        assert [len(b) for b in _saved(tmp_path / "ck")] == [2, 18]
        await ck.add(20, _row(20), {"row": 20})  # under `every`: waits for the shard's end
        await ck.flush()

    asyncio.run(go())
    saved = _saved(tmp_path / "ck")
    assert saved == [[0, 1], list(range(2, 20)), [20]]
    assert [r["row"] for b in records for r in b] == list(range(21))  # each row's metrics once, after its result
    assert sorted(ck.load()) == list(range(21))


def test_flush_waits_for_a_deferred_save_and_cancel_drops_it(tmp_path):
    ck = RowCheckpoint(tmp_path / "a", 1, interval_s=0.2)

    async def go():
        for i in range(5):
            await ck.add(i, _row(i))
        await asyncio.sleep(0.25)  # the deferred save of rows 1-4 is due now
        await ck.flush()  # nothing pending; returns once that save is on disk

    asyncio.run(go())
    assert sorted(r for b in _saved(tmp_path / "a") for r in b) == [0, 1, 2, 3, 4]

    dropped = RowCheckpoint(tmp_path / "b", 1, interval_s=0.2)

    async def fail():
        for i in range(3):
            await dropped.add(i, _row(i))
        dropped.cancel()  # the shard failed: its unsaved rows are served again
        await asyncio.sleep(0.3)

    asyncio.run(fail())
    assert _saved(tmp_path / "b") == [[0]]


def test_interval_zero_saves_every_batch(tmp_path):
    ck = RowCheckpoint(tmp_path / "ck", 3)

    async def go():
        for i in range(9):
            await ck.add(i, _row(i))

    asyncio.run(go())
    assert sorted(_saved(tmp_path / "ck")) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
