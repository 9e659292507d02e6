"""pipeline.report on synthetic run directories (no vLLM): numbers checked against values computed
here from the raw token times, PNGs checked to be real images."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.metrics import WORKER_SCHEMA, StepRecorder, read_worker_metrics, write_request_metrics
from pipeline.report import compare_reports, main, summarize_run, write_report

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_000_000.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _req(key: str, read_at: float, ps: float, pe: float | None, tokens: list[float], *,
         error: str | None = None, prompt: int = 100, cached: int = 0, kv_bytes: int = 0) -> dict:
    return {
        "key": key, "shard": "s0.parquet", "row": int(key.split(":")[1]),
        "prefill_worker": "prefill-0@h" if pe is not None else "colocated-0@h",
        "decode_worker": "decode-0@h" if pe is not None else None,
        "read_at": T0 + read_at, "prefill_start": T0 + ps,
        "prefill_end": None if pe is None else T0 + pe,
        "decode_arrived_at": None if pe is None else T0 + pe + 0.01,
        "token_times": [T0 + t for t in tokens], "prompt_tokens": prompt,
        "output_tokens": len(tokens), "kv_tokens": prompt if pe is not None else 0,
        "kv_bytes": kv_bytes, "prefix_cached_tokens": cached, "tries": 1, "error": error,
    }


# Gaps (s): r0 .02 .02 0 .11 .02 | r1 .01 .09 .02 | r2 .01 .01: exactly two > 60 ms (.11, .09),
# one gap of 0 (two tokens in one streamed output).
REQUESTS = [
    _req("0:0", 0.0, 0.1, 0.3, [0.40, 0.42, 0.44, 0.44, 0.55, 0.57], cached=50, kv_bytes=1000),
    _req("0:1", 0.0, 0.2, 0.5, [0.60, 0.61, 0.70, 0.72], kv_bytes=2000),
    _req("0:2", 0.0, 0.3, 0.6, [0.65, 0.66, 0.67], cached=10, kv_bytes=3000),
    _req("0:3", 0.0, 0.4, None, [], error="prefill failed: boom"),
]

# (worker, role, t, running, kv usage): decode-0 busy on [0,1) [2,4) [4,5) of a 5 s span = 0.8;
# prefill-0 busy on [0,0.5) of a 3 s span.
STEPS = [
    ("decode-0@h", "decode", 4.0, 3, 0.5),
    ("decode-0@h", "decode", 0.0, 2, 0.1),
    ("decode-0@h", "decode", 2.0, 1, 0.05),
    ("decode-0@h", "decode", 5.0, 0, 0.2),
    ("decode-0@h", "decode", 1.0, 0, 0.0),
    ("prefill-0@h", "prefill", 0.0, 1, 0.3),
    ("prefill-0@h", "prefill", 0.5, 0, 0.0),
    ("prefill-0@h", "prefill", 3.0, 0, 0.0),
]


def _write_steps(run: Path, steps, name: str = "steps") -> None:
    # Columns not given here (NIXL telemetry, DRAM tier) are null, as in a step that moved no KV.
    table = pa.Table.from_pylist([{
        "worker": s[0], "role": s[1], "t": T0 + s[2], "running": s[3], "waiting": 0,
        "kv_cache_usage": s[4], "prompt_tokens": 0, "generation_tokens": 1,
        "prefix_cache_queries": 0, "prefix_cache_hits": 0,
    } for s in steps], schema=WORKER_SCHEMA)
    path = run / "metrics" / "workers" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def make_run(path: Path, requests=REQUESTS, steps=STEPS, stretch: float = 1.0) -> Path:
    """A run directory with ``requests`` (all times x ``stretch`` around T0) in two part files."""
    def s(r):
        r = dict(r)
        for k in ("read_at", "prefill_start", "prefill_end", "decode_arrived_at"):
            if r[k] is not None:
                r[k] = T0 + (r[k] - T0) * stretch
        r["token_times"] = [T0 + (t - T0) * stretch for t in r["token_times"]]
        return r

    reqs = [s(r) for r in requests]
    write_request_metrics(path, "s0.parquet", reqs[:2])
    write_request_metrics(path, "s0.parquet", reqs[2:])
    if steps:
        _write_steps(path, [(w, r, t * stretch, n, kv) for w, r, t, n, kv in steps])
    (path / "summary.json").write_text(json.dumps({"rows": len(requests), "wall_s": 9.0}))
    return path


def _gaps() -> list[np.ndarray]:
    return [np.diff(np.array(r["token_times"])) for r in REQUESTS if len(r["token_times"]) > 1]


def _assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 2000, (path, len(data))
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0.01  # not a blank canvas


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("run"))
    return run, write_report(run)


def test_report_files(report):
    run, rep = report
    out = run / "report"
    for name in ("timeline.png", "latency.png", "utilisation.png"):
        _assert_png(out / name)
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(rep))
    assert rep["files"]["timeline"] == str(out / "timeline.png")


def test_counts_and_stalls_match_raw_token_times(report):
    _, rep = report
    gaps = _gaps()
    stalls = int(sum((g > 0.060).sum() for g in gaps))
    assert stalls == 2
    assert rep["stalls"] == stalls
    assert rep["requests_with_stalls"] == sum(1 for g in gaps if (g > 0.060).any()) == 2
    assert rep["stall_threshold_s"] == 0.060
    assert rep["requests"] == 4 and rep["errors"] == 1
    assert rep["output_tokens"] == 13 and rep["prompt_tokens"] == 400
    assert rep["itl_gaps"] == 10 and rep["itl_zero_gaps"] == 1
    assert rep["mode"] == "disaggregated"
    assert rep["timeline_rows"] == rep["requests"] == 4 and not rep["timeline_subsampled"]
    assert rep["run_summary"] == {"rows": 4, "wall_s": 9.0}


def test_latency_percentiles(report):
    _, rep = report
    itl = np.concatenate(_gaps())
    for q in (50, 90, 99):
        assert rep[f"itl_p{q}_s"] == pytest.approx(np.percentile(itl, q))
    assert rep["itl_max_s"] == pytest.approx(0.11)
    ttft = np.array([0.30, 0.40, 0.35])  # token_times[0] - prefill_start, by hand
    assert rep["ttft_p50_s"] == pytest.approx(0.35)
    assert rep["ttft_max_s"] == pytest.approx(0.40)
    for q in (90, 99):
        assert rep[f"ttft_p{q}_s"] == pytest.approx(np.percentile(ttft, q))
    assert rep["ttft_p99_s"] == pytest.approx(0.35 + 0.05 * 0.98)  # linear interpolation
    handoff = np.array([0.10, 0.10, 0.05])
    assert rep["kv_handoff_p50_s"] == pytest.approx(0.10)
    assert rep["kv_handoff_p99_s"] == pytest.approx(np.percentile(handoff, 99))
    assert rep["queue_wait_p50_s"] == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4], 50))
    assert rep["prefill_p50_s"] == pytest.approx(0.3)
    assert rep["prefill_p99_s"] == pytest.approx(0.3)
    # wall: first read_at (0) to the last token (0.72)
    assert rep["wall_s"] == pytest.approx(0.72)
    assert rep["output_tokens_per_s"] == pytest.approx(13 / 0.72)
    assert rep["kv_total_bytes"] == 6000
    assert rep["prefix_cache_hit_rate"] == pytest.approx(60 / 400)


def test_worker_utilisation(report):
    _, rep = report
    d, p = rep["workers"]["decode-0@h"], rep["workers"]["prefill-0@h"]
    assert d["role"] == "decode" and d["steps"] == 5
    assert d["span_s"] == pytest.approx(5.0)
    assert d["busy_fraction"] == pytest.approx(0.8)
    assert d["mean_batch_size"] == pytest.approx(2.0)  # (2 + 1 + 3) / 3 steps with running > 0
    assert d["max_batch_size"] == 3
    assert d["max_kv_cache_usage"] == pytest.approx(0.5)
    assert p["busy_fraction"] == pytest.approx(0.5 / 3.0)
    assert rep["busy_fraction"] == {"decode-0@h": pytest.approx(0.8), "prefill-0@h": pytest.approx(0.5 / 3)}
    assert rep["mean_batch_size"] == pytest.approx((2 + 1 + 3 + 1) / 4)
    assert rep["max_batch_size"] == 3
    assert rep["max_kv_cache_usage"] == pytest.approx(0.5)


def test_step_recorder_table_is_read(tmp_path):
    """A worker table written by the real StepRecorder is summarised (busy fraction from its
    own timestamps)."""
    class Sched:
        def __init__(self, n):
            self.num_running_reqs, self.num_waiting_reqs, self.num_skipped_waiting_reqs = n, 0, 0
            self.kv_cache_usage = 0.25
            self.prefix_cache_stats = None

    from vllm.v1.metrics.stats import IterationStats

    def It():  # noqa: N802 (vLLM's own iteration stats: one generated token)
        it = IterationStats()
        it.num_generation_tokens = 1
        return it

    run = make_run(tmp_path / "run", steps=None)
    rec = StepRecorder(run, "decode-0@h", "decode")
    for n in (1, 2, 0):
        rec.record(Sched(n), It())
    rec.flush()
    t = sorted(read_worker_metrics(run).column("t").to_pylist())
    rep = summarize_run(run)
    w = rep["workers"]["decode-0@h"]
    assert w["steps"] == 3 and w["max_batch_size"] == 2 and w["max_kv_cache_usage"] == 0.25
    if t[-1] > t[0]:
        assert w["busy_fraction"] == pytest.approx(1.0)  # running > 0 until the last step


def test_colocated_and_no_worker_metrics(tmp_path):
    reqs = [_req("0:0", 0.0, 0.1, None, [0.3, 0.31, 0.40]), _req("0:1", 0.0, 0.2, None, [0.5])]
    run = make_run(tmp_path / "run", requests=reqs, steps=None)
    rep = write_report(run, tmp_path / "out")
    assert rep["mode"] == "colocated"
    assert rep["kv_handoff_p50_s"] is None and rep["prefill_p50_s"] is None
    assert rep["ttft_p50_s"] == pytest.approx(0.25)
    assert rep["stalls"] == 1 and rep["requests_with_stalls"] == 1
    assert rep["workers"] == {} and rep["max_kv_cache_usage"] is None
    for name in ("timeline.png", "latency.png", "utilisation.png"):
        _assert_png(tmp_path / "out" / name)


def test_stall_threshold_is_a_parameter(tmp_path):
    run = make_run(tmp_path / "run")
    rep = summarize_run(run, stall_s=0.015)
    expected = int(sum((g > 0.015).sum() for g in _gaps()))
    assert rep["stalls"] == expected == 6


def test_timeline_subsamples_many_requests(tmp_path):
    reqs = [_req(f"0:{i}", 0.0, 0.01 * i, 0.01 * i + 0.05, [0.01 * i + 0.1 + 0.02 * k for k in range(5)])
            for i in range(620)]
    run = make_run(tmp_path / "run", requests=reqs)
    rep = write_report(run)
    assert rep["requests"] == 620
    assert rep["timeline_rows"] == 500 and rep["timeline_subsampled"]
    _assert_png(run / "report" / "timeline.png")


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
    _assert_png(tmp_path / "cmp" / "compare.png")


def test_compare_ratio_null_when_a_is_zero(tmp_path):
    a = make_run(tmp_path / "a", requests=REQUESTS[2:])  # no stalls
    b = make_run(tmp_path / "b")
    res = compare_reports(a, b, tmp_path / "cmp")
    assert res["a"]["stalls"] == 0 and res["ratios_b_over_a"]["stalls"] is None


@pytest.mark.parametrize("kind", ["missing", "empty", "garbage"])
def test_bad_run_dir_is_a_clear_error(tmp_path, kind):
    run = tmp_path / "run"
    if kind != "missing":
        run.mkdir()
    if kind == "garbage":
        part = run / "metrics" / "requests" / "s0.parquet" / "part-0.parquet"
        part.parent.mkdir(parents=True)
        part.write_bytes(b"not parquet at all\nsecond line")
    exc_type = ValueError if kind == "garbage" else FileNotFoundError
    with pytest.raises(exc_type) as info:
        write_report(run)
    msg = str(info.value)
    assert "\n" not in msg and str(run) in msg
    assert not (run / "report").exists()


def test_cli(tmp_path, capsys):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", stretch=2.0)
    assert main([str(a), "--compare", str(b), "--out", str(tmp_path / "out"), "--stall-ms", "100"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "out") in out and "compare.json" in out
    assert "stalls (> 100 ms) 1 in 1 requests" in out
    for name in ("report.json", "timeline.png", "latency.png", "utilisation.png",
                 "compare.json", "compare.png"):
        assert (tmp_path / "out" / name).is_file()
    assert json.loads((tmp_path / "out" / "report.json").read_text())["stall_threshold_s"] == 0.1
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run directory not found") and err.count("\n") == 1


def test_cli_as_module(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pipeline.report", str(tmp_path / "empty")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("error: run directory not found") and p.stderr.count("\n") == 1


def test_steps_without_scheduler_stats_keep_the_previous_state(tmp_path):
    """A step row with null running (vLLM gave no scheduler stats) keeps the previous row's
    batch size; a worker with no batch sizes at all has null stats, not an error."""
    steps = [("colocated-0@h", "colocated", 0.0, 1, 0.1), ("colocated-0@h", "colocated", 1.0, None, None),
             ("colocated-0@h", "colocated", 2.0, 0, 0.0), ("colocated-1@h", "colocated", 0.0, None, None),
             ("colocated-1@h", "colocated", 1.0, None, None)]
    run = make_run(tmp_path / "run", steps=steps)
    rep = write_report(run)
    w0, w1 = rep["workers"]["colocated-0@h"], rep["workers"]["colocated-1@h"]
    assert w0["busy_fraction"] == pytest.approx(1.0) and w0["max_kv_cache_usage"] == pytest.approx(0.1)
    assert w1["busy_fraction"] == 0.0 and w1["max_batch_size"] is None and w1["mean_batch_size"] is None
    _assert_png(run / "report" / "utilisation.png")
