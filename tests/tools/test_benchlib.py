"""tools/benchlib, the pieces the benchmark scripts share: tables, summaries, child processes and
CPU sampling (real processes, no engines)."""

from __future__ import annotations

import json
import sys
import time

from tools.benchlib.procs import python, spawn, stop, wait_all
from tools.benchlib.results import write_json
from tools.benchlib.sampling import ProcSampler
from tools.benchlib.stats import median_of, percentile, ratio
from tools.benchlib.tables import fmt, md_table
from tools.benchlib.timing import time_calls


def test_md_table_rule_alignment_and_blank_cells():
    assert md_table(["a", "b", "c"], [[1, "", 2.5]], "lr") == "| a | b | c |\n|---|---:|---|\n| 1 | | 2.5 |"


def test_fmt_units():
    assert [fmt(None), fmt(0.01234, "ms"), fmt(1.234, "s"), fmt(1.5, "x"), fmt(2.25), fmt(3)] == \
        ["-", "12.3", "1.23", "1.50x", "2.2", "3"]


def test_median_of_skips_missing_values():
    runs = [{"a": 1.0, "cpu": {"x": 4}}, {"a": None, "cpu": {}}, {"a": 3.0}, {"cpu": {"x": 2}}]
    assert median_of(runs, "a") == 2.0
    assert median_of(runs, "cpu", "x") == 3.0
    assert median_of(runs, "b") is None
    assert percentile([None, 1.0, 3.0], 50) == 2.0 and percentile([None], 50) is None
    assert ratio(2.0, 3.0) == 1.5 and ratio(0, 3.0) is None and ratio(2.0, None) is None


def test_time_calls_and_write_json(tmp_path):
    times = time_calls(lambda: time.sleep(0.01), 3)
    assert len(times) == 3 and all(t >= 0.009 for t in times)
    write_json(tmp_path / "r.json", {"path": tmp_path, "x": [1]})
    assert json.loads((tmp_path / "r.json").read_text()) == {"path": str(tmp_path), "x": [1]}


def test_sampler_sees_a_busy_child_and_stop_ends_a_stuck_one(tmp_path):
    with open(tmp_path / "busy.log", "w") as log:
        busy = spawn(python("-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"), log)
        sampler = ProcSampler(busy.pid, 0.05).start()
        t0 = time.time()
        wait_all([busy], 30)
        sampler.stop()
    assert busy.returncode == 0
    window = sampler.window(t0, time.time(), {busy.pid: "busy"})
    assert window["cores_by_process"]["busy"] > 0
    assert any(t["process"] == "busy" for t in window["top_threads"])

    with open(tmp_path / "stuck.log", "w") as log:
        stuck = spawn([sys.executable, "-c", "import time; time.sleep(60)"], log)
        wait_all([stuck], 0.1)  # at least 1 s, then left running
        assert stuck.poll() is None
        assert stop(stuck, grace_s=5) == -15
