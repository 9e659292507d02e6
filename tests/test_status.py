"""``python -m pipeline.status RUN_DIR`` (pipeline.status): rows/s of a finished run is the
run's own (rows over launch -> end), not rows over launch -> now, which kept falling after the
end. The run directories here are hand-made with the real RunDir: a config from compose, done
markers and progress as workers write them, the launch time set on shards.json."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipeline.config import compose
from pipeline.io.atomic import write_json
from pipeline.io.shards import Shard
from pipeline.runtime.rundir import RunDir
from pipeline.status import elapsed_s, status_text

ROWS = {0: 10, 1: 20}  # rows of each shard


def _run(tmp_path) -> tuple[RunDir, list[Shard], float]:
    """A run launched 100 s ago (shards.json written then) with two shards of 10 and 20 rows,
    whose one worker finished all 30 rows; no shard marked done yet."""
    run = RunDir(tmp_path / "run")
    shards = [Shard(index=i, url=str(tmp_path / f"part-{i}.parquet"), name=f"part-{i}.parquet") for i in ROWS]
    run.create(compose(["+job=summarize"]), shards, str(tmp_path / "out"), rows=sum(ROWS.values()))
    start = time.time() - 100
    os.utime(run.path / "shards.json", (start, start))
    run.write_progress("prefill-0@n1", {"worker": "prefill-0@n1", "rows": 30, "output_tokens": 480, "shards": 2})
    return run, shards, start


def _done(run: RunDir, shard: Shard, started_at: float, finished_at: float) -> None:
    run.mark_done(shard, {"shard": shard.name, "rows": ROWS[shard.index], "errors": 0, "prompt_tokens": 100,
                          "output_tokens": 16 * ROWS[shard.index], "worker": "prefill-0@n1",
                          "resumed_rows": 0, "started_at": started_at, "finished_at": finished_at})


def test_finished_run_reports_its_own_rate_and_keeps_it(tmp_path):
    run, shards, start = _run(tmp_path)
    _done(run, shards[0], start + 5, start + 30)
    # Still running (part-1 open): rows over launch -> now, ~100 s so far.
    assert elapsed_s(run) == pytest.approx(100, abs=5)
    _done(run, shards[1], start + 30, start + 60)
    # Finished: launch -> the last shard's finished_at = 60 s; 30 rows / 60 s = 0.50 rows/s.
    assert elapsed_s(run) == pytest.approx(60, abs=1e-3)
    text = status_text(run)
    assert "(finished)" in text and "rows: 30/30 | 0.50 rows/s | ETA 0 s" in text
    time.sleep(1.0)
    assert elapsed_s(run) == pytest.approx(60, abs=1e-3)
    assert status_text(run) == text
    # The same from the command line.
    p = subprocess.run([sys.executable, "-m", "pipeline.status", str(run.path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "rows: 30/30 | 0.50 rows/s" in p.stdout


def test_summary_wall_time_is_the_end_when_written_by_this_launch(tmp_path):
    run, shards, start = _run(tmp_path)
    _done(run, shards[0], start - 400, start - 300)  # left by an earlier launch: not this one's end
    _done(run, shards[1], start + 10, start + 50)
    assert elapsed_s(run) == pytest.approx(50, abs=1e-3)  # 30 rows / 50 s
    stale = run.path / "summary.json"
    write_json(stale, {"wall_s": 400.0})
    os.utime(stale, (start - 200, start - 200))  # written before this launch: ignored
    assert elapsed_s(run) == pytest.approx(50, abs=1e-3)
    write_json(run.path / "summary.json", {"wall_s": 75.0})  # the launcher's own launch -> end
    assert elapsed_s(run) == pytest.approx(75, abs=1e-3)
    assert "rows: 30/30 | 0.40 rows/s" in status_text(run)


def test_engines_starting_are_shown_until_every_engine_that_has_work_is_ready(tmp_path):
    """The first minute of a run, while engines start: the line counts engines ready against the
    launch's jobs (jobs.json), leaving out array tasks beyond the work units (3 tasks over these 2
    shards: one finds nothing to claim and starts no engine), and goes once every engine is ready. A relaunch into the
    same run directory starts counting again."""
    run, shards, _ = _run(tmp_path)
    write_json(run.path / "jobs.json", {"array_tasks": ["11", "12", "13"], "decode": ["10"]})
    assert run.starting_engines(3, 1) == "starting engines: prefill 0/2, decode 0/1 ready"
    assert "starting engines: prefill 0/2, decode 0/1 ready" in status_text(run)
    run.mark_engine_ready("decode-0@n3", "decode", time.time() - 40)
    run.mark_engine_ready("prefill-1@n2", "prefill", time.time() - 40)
    assert "starting engines: prefill 1/2, decode 1/1 ready" in status_text(run)
    run.mark_engine_ready("prefill-0@n1", "prefill", time.time() - 40)
    assert run.starting_engines(3, 1) is None and "starting engines" not in status_text(run)
    colocated = RunDir(tmp_path / "coloc")
    colocated.create(compose(["+job=summarize", "pools=colocated"]), shards, str(tmp_path / "out2"))
    assert colocated.starting_engines(1, 0) == "starting engines: colocated 0/1 ready"
    run.create(compose(["+job=summarize"]), shards, str(tmp_path / "out"))
    assert run.starting_engines(3, 1) == "starting engines: prefill 0/2, decode 0/1 ready"


def test_the_shards_being_served_are_named_with_their_holder(tmp_path):
    from pipeline.runtime.claims import Claims

    run, shards, start = _run(tmp_path)
    assert "serving" not in status_text(run)  # nothing claimed yet
    Claims(run.path, "prefill-0@n1").claim_next([0])
    later = Claims(run.path, "prefill-1@n2", dead_after_s=0.0)
    later.claim_next([1])
    assert "serving: part-0.parquet (prefill-0), part-1.parquet (prefill-1)" in status_text(run)
    _done(run, shards[0], start + 5, start + 30)
    # prefill-1 went silent; prefill-0 takes its shard over (dead after 0 s: at once).
    taker = Claims(run.path, "prefill-0@n1", dead_after_s=0.0)
    assert taker.alive("prefill-1@n2")  # first look: not watched long enough
    deadline = time.monotonic() + 5
    while taker.alive("prefill-1@n2"):  # dead once this clock has moved on from the first look
        assert time.monotonic() < deadline, "prefill-1 never counted as dead"
    assert taker.claim_next([0, 1], settled={0}) == 1
    text = status_text(run)
    assert "serving: part-1.parquet (prefill-0, taken over)" in text, text
