"""pipeline.report.write: report.json and the PNGs (checked to be real images) of synthetic runs."""

from __future__ import annotations

import json

import pytest

from pipeline.report.write import write_report
from tests.report.synthetic import assert_png, make_run, req


def test_report_files(report):
    run, rep = report
    out = run / "report"
    for name in ("timeline.png", "latency.png", "utilisation.png"):
        assert_png(out / name)
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(rep))
    assert rep["files"]["timeline"] == str(out / "timeline.png")


def test_colocated_and_no_worker_metrics(tmp_path):
    reqs = [req("0:0", 0.0, 0.1, None, [0.3, 0.31, 0.40]), req("0:1", 0.0, 0.2, None, [0.5])]
    run = make_run(tmp_path / "run", requests=reqs, steps=None)
    rep = write_report(run, tmp_path / "out")
    assert rep["mode"] == "colocated"
    assert rep["kv_handoff_p50_s"] is None and rep["prefill_p50_s"] is None
    assert rep["ttft_p50_s"] == pytest.approx(0.25)
    assert rep["stalls"] == 1 and rep["requests_with_stalls"] == 1
    assert rep["workers"] == {} and rep["max_kv_cache_usage"] is None
    for name in ("timeline.png", "latency.png", "utilisation.png"):
        assert_png(tmp_path / "out" / name)
