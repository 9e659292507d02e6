"""pipeline.report.compare: compare.json's ratios and side-by-side numbers of two synthetic runs."""

from __future__ import annotations

import json

import pytest

from pipeline.report.compare import compare_reports
from pipeline.report.summary import summarize_run
from tests.report.synthetic import REQUESTS, assert_png, make_run


def test_compare_ratios(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", stretch=2.0)  # everything twice as slow
    res = compare_reports(a, b, tmp_path / "cmp", labels=("colocated", "disaggregated"))
    r = res["ratios_b_over_a"]
    assert r["output_tokens_per_s"] == pytest.approx(0.5)
    assert r["ttft_p99_s"] == pytest.approx(2.0)
    assert r["itl_p99_s"] == pytest.approx(2.0)
    assert r["itl_max_s"] == pytest.approx(2.0)
    # b's gaps: .04 .04 0 .22 .04 | .02 .18 .04 | .02 .02 -> 2 stalls, as in a
    assert res["a"]["stalls"] == 2 and res["b"]["stalls"] == 2 and r["stalls"] == 1.0
    ra, rb = summarize_run(a), summarize_run(b)
    assert r["ttft_p99_s"] == pytest.approx(rb["ttft_p99_s"] / ra["ttft_p99_s"])
    assert res["side_by_side"]["itl_max_s"] == [pytest.approx(0.11), pytest.approx(0.22)]
    assert res["labels"] == ["colocated", "disaggregated"]
    on_disk = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert on_disk["ratios_b_over_a"] == json.loads(json.dumps(r))
    assert_png(tmp_path / "cmp" / "compare.png")


def test_compare_ratio_null_when_a_is_zero(tmp_path):
    a = make_run(tmp_path / "a", requests=REQUESTS[2:])  # no stalls
    b = make_run(tmp_path / "b")
    res = compare_reports(a, b, tmp_path / "cmp")
    assert res["a"]["stalls"] == 0 and res["ratios_b_over_a"]["stalls"] is None
