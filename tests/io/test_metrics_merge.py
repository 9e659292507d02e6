"""A done shard's request metrics merged into one file (issue #39: a run directory held a metrics
file per ``job.checkpoint_rows`` rows, 250,000 of them at 10^6 rows, and the report read each):
readers count every row once before, during and after the merge, and a merge that was cut off
is finished by the next."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq

from pipeline.config import compose
from pipeline.io.metrics import (MERGED_PREFIX, compact_request_metrics, read_request_metrics,
                                 request_metrics_files, write_request_metrics)
from pipeline.io.shards import Shard
from pipeline.runtime.rundir import RunDir, wait_for_merges


def _records(shard: int, rows: int) -> list[dict]:
    return [{"key": f"{shard}:{r}", "shard": f"s{shard}.parquet", "row": r, "prefill_worker": "colocated-0@h",
             "read_at": 1.0 * r, "prefill_start": 1.0 * r + 0.1, "token_times": [r + 0.3, r + 0.35],
             "prompt_tokens": 10, "output_tokens": 2, "tries": 1} for r in range(rows)]


def _write_parts(run, shard: int, rows: int, every: int) -> None:
    recs = _records(shard, rows)
    for k in range(0, rows, every):
        write_request_metrics(run, f"s{shard}.parquet", recs[k:k + every])


def _keys(run) -> list[str]:
    return sorted(read_request_metrics(run).column("key").to_pylist())


def test_merge_keeps_every_row_once_in_one_file(tmp_path):
    _write_parts(tmp_path, 0, 10, 4)
    _write_parts(tmp_path, 1, 3, 4)
    before = read_request_metrics(tmp_path)
    assert compact_request_metrics(tmp_path, "s0.parquet") == 3
    assert compact_request_metrics(tmp_path, "s1.parquet") == 0  # one part: nothing to do
    files = request_metrics_files(tmp_path)
    assert [p.parent.name for p in files] == ["s0.parquet", "s1.parquet"]
    assert files[0].name.startswith(MERGED_PREFIX)
    after = read_request_metrics(tmp_path)
    assert after.equals(before)  # the same rows in the same order: the report's figures stay


def test_a_merge_cut_off_before_its_parts_were_removed_counts_each_row_once(tmp_path):
    _write_parts(tmp_path, 0, 10, 4)
    folder = tmp_path / "metrics" / "requests" / "s0.parquet"
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    compact_request_metrics(tmp_path, "s0.parquet")
    for p in kept.iterdir():  # the parts back beside the merged file, as if the merge stopped there
        shutil.copy(p, folder / p.name)
    assert len(list(folder.iterdir())) == 4
    assert _keys(tmp_path) == sorted(f"0:{r}" for r in range(10))
    # A late part (a row served after the merge) is read too, and the next merge takes it in.
    write_request_metrics(tmp_path, "s0.parquet", _records(0, 11)[10:])
    assert len(_keys(tmp_path)) == 11
    assert compact_request_metrics(tmp_path, "s0.parquet") == 2  # the merged file and the late part
    assert [p.name.startswith(MERGED_PREFIX) for p in folder.iterdir()] == [True]
    assert _keys(tmp_path) == sorted(f"0:{r}" for r in range(11))
    assert pq.ParquetFile(next(folder.iterdir())).metadata.num_rows == 11


def test_marking_a_shard_done_merges_its_metrics_in_the_background(tmp_path):
    run = RunDir(tmp_path / "run")
    shard = Shard(index=0, url=str(tmp_path / "s0.parquet"), name="s0.parquet")
    run.create(compose(["+job=summarize", "pools=colocated"]), [shard], str(tmp_path / "out"), rows=10)
    _write_parts(run.path, 0, 10, 4)
    future = run.mark_done(shard, {"rows": 10})
    assert run.done_path(shard).is_file()
    assert future.result(timeout=60) == 3
    wait_for_merges()
    files = request_metrics_files(run.path)
    assert len(files) == 1 and files[0].name.startswith(MERGED_PREFIX)
    assert _keys(run.path) == sorted(f"0:{r}" for r in range(10))


def test_a_reader_that_listed_the_parts_before_a_merge_reads_again(tmp_path, monkeypatch):
    import pipeline.io.metrics as metrics
    from pipeline.report.load import read_requests

    _write_parts(tmp_path, 0, 10, 4)
    stale = metrics.request_metrics_files(tmp_path)
    compact_request_metrics(tmp_path, "s0.parquet")  # another process's merge, after the listing
    real, calls = metrics.request_metrics_files, []

    def listing(run_path):
        calls.append(1)
        return stale if len(calls) == 1 else real(run_path)

    monkeypatch.setattr(metrics, "request_metrics_files", listing)
    assert _keys(tmp_path) == sorted(f"0:{r}" for r in range(10)) and len(calls) == 2
    calls.clear()
    assert len(read_requests(tmp_path)) == 10 and len(calls) == 2
