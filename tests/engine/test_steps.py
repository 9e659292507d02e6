"""Per-step engine metrics (pipeline/engine/steps.py) when their file cannot be written: a real
write failure (the run's ``metrics`` path is a plain file, so the parts' folder cannot be made)
keeps the steps for the next flush and says so; nothing is dropped without a warning. The
stats are vLLM's own classes; the parts are read back with pyarrow alone."""

from __future__ import annotations

import logging
import os

import pyarrow.parquet as pq

from pipeline.engine import steps
from pipeline.engine.steps import StepRecorder


def _stats(running: int):
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    it = IterationStats()
    it.num_generation_tokens = 1
    return SchedulerStats(num_running_reqs=running), it


def _written(run) -> list[int]:
    """The ``running`` column of every part written, in part order, read with pyarrow alone."""
    parts = sorted((run / "metrics" / "workers").glob("*.parquet"))
    return [v for p in parts for v in pq.read_table(p).column("running").to_pylist()]


def _broken(run):
    """Make the parts' folder impossible to create, for real; returns the OS's own error text."""
    (run / "metrics").write_text("not a folder")
    try:
        os.makedirs(run / "metrics" / "workers")
    except OSError as exc:
        return exc.strerror
    raise AssertionError("the folder could be made: this test needs a file system that refuses it")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pipeline.engine.steps" and r.levelno == logging.WARNING]


def test_steps_that_cannot_be_written_are_kept_and_written_at_the_next_flush(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    why = _broken(run)
    rec = StepRecorder(run, "decode-0@h", "decode")
    caplog.set_level(logging.WARNING, "pipeline.engine.steps")
    for n in (1, 2, 3):
        rec.record(*_stats(n))
    rec.flush()  # fails: no exception, one warning naming where and why
    rec.record(*_stats(4))
    rec.flush()  # fails again: no second warning within WARN_EVERY_S
    said = _warnings(caplog)
    assert len(said) == 1 and str(run / "metrics" / "workers") in said[0] and why in said[0], said
    (run / "metrics").unlink()  # the file system is back
    rec.record(*_stats(5))
    rec.close()
    assert _written(run) == [1, 2, 3, 4, 5]
    assert len(_warnings(caplog)) == 2  # and one saying the metrics are written again, nothing lost


def test_past_the_limit_the_oldest_steps_are_dropped_and_counted(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(steps, "HELD_STEPS_MAX", 2)  # the limit's value, not a stand-in for a part
    run = tmp_path / "run"
    run.mkdir()
    _broken(run)
    rec = StepRecorder(run, "prefill-0@h", "prefill")
    caplog.set_level(logging.WARNING, "pipeline.engine.steps")
    for n in (1, 2, 3, 4, 5):
        rec.record(*_stats(n))
    rec.flush()
    (run / "metrics").unlink()
    rec.close()
    kept = _written(run)
    assert kept == [4, 5]  # the newest two
    lost = 5 - len(kept)
    assert any(m.startswith(f"{lost} engine steps of prefill-0@h were never written") for m in _warnings(caplog))


def test_steps_never_written_by_the_end_are_counted_in_a_warning(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    why = _broken(run)
    rec = StepRecorder(run, "colocated-0@h", "colocated")
    caplog.set_level(logging.WARNING, "pipeline.engine.steps")
    for n in range(7):
        rec.record(*_stats(n))
    rec.close()  # still failing at the worker's end
    last = _warnings(caplog)[-1]
    assert last.startswith(f"7 engine steps of colocated-0@h were never written to {run / 'metrics' / 'workers'}")
    assert why in last
    assert not (run / "metrics").is_dir()


def test_nothing_recorded_writes_and_says_nothing(tmp_path, caplog):
    rec = StepRecorder(tmp_path, "decode-0@h", "decode")
    caplog.set_level(logging.WARNING, "pipeline.engine.steps")
    rec.close()
    assert not (tmp_path / "metrics").exists() and _warnings(caplog) == []


def test_parts_are_merged_level_by_level_and_read_once(tmp_path, monkeypatch):
    """A worker running for hours: its files stay about MERGE_PARTS a level, and every step is
    read back once, also from a listing taken halfway through a merge (the merged file written,
    its parts not yet removed)."""
    from pipeline.io.metrics import read_worker_metrics, worker_metrics_files

    monkeypatch.setattr(steps, "MERGE_PARTS", 4)
    run = tmp_path / "run"
    rec = StepRecorder(run, "decode-0@h", "decode")
    n = 4 * 4 + 4 + 3  # one level-2 file (parts 0-15), one level-1 (16-19), 3 parts
    for k in range(n):
        rec.record(*_stats(k))
        rec.flush()
    names = sorted(p.name.split(".", 2)[2] for p in (run / "metrics" / "workers").glob("*.parquet"))
    assert names == ["00000-00015.parquet", "00016-00019.parquet", "00020.parquet", "00021.parquet", "00022.parquet"]
    assert sorted(_written(run)) == list(range(n))  # pyarrow alone: each step in exactly one file
    assert read_worker_metrics(run).column("running").to_pylist() == list(range(n))
    # Halfway through merging 20-23: the merged file is in place, parts 20-22 not yet removed.
    rec.record(*_stats(n))
    folder = run / "metrics" / "workers"
    keep = {p.name: p.read_bytes() for p in folder.glob("*.000[2]?.parquet")}
    rec.flush()
    for name, data in keep.items():
        (folder / name).write_bytes(data)
    assert len(list(folder.glob("*.parquet"))) == 2 + 3 + 1
    assert len(worker_metrics_files(run)) == 3
    assert sorted(read_worker_metrics(run).column("running").to_pylist()) == list(range(n + 1))
