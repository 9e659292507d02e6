"""pipeline.report.plots: the timeline of many requests draws an evenly spaced subset."""

from __future__ import annotations

from pipeline.report.write import write_report
from tests.report.synthetic import assert_png, make_run, req


def test_timeline_subsamples_many_requests(tmp_path):
    reqs = [req(f"0:{i}", 0.0, 0.01 * i, 0.01 * i + 0.05, [0.01 * i + 0.1 + 0.02 * k for k in range(5)])
            for i in range(620)]
    run = make_run(tmp_path / "run", requests=reqs)
    rep = write_report(run)
    assert rep["requests"] == 620
    assert rep["timeline_rows"] == 500 and rep["timeline_subsampled"]
    assert_png(run / "report" / "timeline.png")
