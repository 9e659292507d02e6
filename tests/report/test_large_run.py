"""The report of a run larger than its plots draw (issue #39): the numbers are over every value,
as numpy gives them from the raw token times; the ITL CDF is drawn through ``ECDF_MAX_POINTS``
values and a worker of more than ``UTILISATION_MAX_POINTS`` steps through its spans' peaks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.metrics import WORKER_SCHEMA, write_request_metrics
from pipeline.report import plots
from pipeline.report.write import write_report
from tests.report.synthetic import assert_png, req

ROWS, TOKENS = 2500, 10  # 22,500 gaps: more than ECDF_MAX_POINTS


def _run(path):
    rng = np.random.default_rng(1)
    reqs = []
    for r in range(ROWS):
        gaps = rng.uniform(0.01, 0.05, TOKENS - 1)
        gaps[rng.random(TOKENS - 1) < 0.01] = 0.2  # stalls
        first = 0.5 + r * 0.01
        tokens = [first, *(first + np.cumsum(gaps))]
        reqs.append(req(f"0:{r}", r * 0.01, r * 0.01 + 0.1, None if r % 3 else r * 0.01 + 0.3, tokens,
                        error="x" if r == 7 else None))
    for k in range(0, ROWS, 500):
        write_request_metrics(path, "s0.parquet", reqs[k:k + 500])
    n = plots.UTILISATION_MAX_POINTS * 2 + 1
    steps = pa.table({"worker": ["decode-0@h"] * n, "role": ["decode"] * n, "t": np.arange(n) * 0.01,
                      "running": np.where(np.arange(n) == 4321, 99, 1).astype(np.int32)})
    cols = {f.name: steps.column(f.name) if f.name in steps.column_names else pa.nulls(n, f.type)
            for f in WORKER_SCHEMA}
    (path / "metrics" / "workers").mkdir(parents=True)
    pq.write_table(pa.table(cols, schema=WORKER_SCHEMA), path / "metrics" / "workers" / "d.parquet")
    return reqs


def test_numbers_are_over_every_value_and_the_plots_are_drawn(tmp_path):
    reqs = _run(tmp_path)
    rep = write_report(tmp_path)
    gaps = np.concatenate([np.diff(r["token_times"]) for r in reqs])
    assert gaps.size > plots.ECDF_MAX_POINTS
    assert rep["requests"] == ROWS and rep["errors"] == 1 and rep["itl_gaps"] == gaps.size
    for q in (50, 90, 99):
        assert rep[f"itl_p{q}_s"] == np.percentile(gaps, q)
    assert rep["stalls"] == int((gaps > 0.060).sum())
    assert rep["requests_with_stalls"] == sum(1 for r in reqs if (np.diff(r["token_times"]) > 0.060).any())
    ttft = np.array([r["token_times"][0] - r["prefill_start"] for r in reqs])
    assert rep["ttft_p99_s"] == np.percentile(ttft, 99)
    assert rep["workers"]["decode-0@h"]["max_batch_size"] == 99
    for name in ("latency", "utilisation", "timeline"):
        assert_png(tmp_path / "report" / f"{name}.png")


def test_a_busy_workers_line_keeps_its_peaks():
    t = np.arange(100_000) * 0.001
    running = np.ones(t.size)
    running[54_321] = 64.0
    kv = np.full(t.size, np.nan)
    kv[10] = 0.5
    tt, rr, kk = plots._envelope(t, running, kv)
    assert tt.size <= plots.UTILISATION_MAX_POINTS and tt[0] == 0.0
    assert rr.max() == 64.0 and np.nanmax(kk) == 0.5 and np.isnan(kk[-1])
