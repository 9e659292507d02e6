"""Calibration from a run's output shards (pipeline/plan/calibrate.py), fitted to a made-up run
of the toy model (tests/plan/toy.py) and worked by hand."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io.metrics import write_request_metrics
from pipeline.plan.calibrate import calibrate, workload_from_run
from pipeline.plan.hardware import HARDWARE
from tests.plan.toy import TOY


def _shard(path: Path, rows: list[dict]) -> None:
    cols = ["prompt_tokens", "output_tokens", "queue_s", "prefill_s", "ttft_s", "decode_s", "kv_handoff_s", "error"]
    types = [pa.int32(), pa.int32(), pa.float64(), pa.float64(), pa.float64(), pa.float64(), pa.float64(), pa.string()]
    pq.write_table(pa.table({c: pa.array([r.get(c) for r in rows], t) for c, t in zip(cols, types)}), path)


def test_calibrate_fits_flops_bandwidth_and_link_by_hand(tmp_path):
    # Output shards of a made-up 1P:1D run of the toy model (written here, so the fit can be
    # worked by hand; a real run's shards have the same columns).
    row = dict(prompt_tokens=1000, output_tokens=101, queue_s=0.0, prefill_s=1.0, ttft_s=1.5,
               decode_s=10.0, kv_handoff_s=0.5)
    _shard(tmp_path / "part-00000.parquet", [row, row, {**row, "ttft_s": 6.5}])
    _shard(tmp_path / "part-00001.parquet", [{**row, "queue_s": 0.5, "prefill_s": 2.0, "ttft_s": 2.5},
                                              {"error": "text is null", "output_tokens": 0}])
    hw = calibrate(tmp_path, TOY, "cpu")
    # FLOP/s: 4 prompts x 1.01e10 FLOPs over the prefill busy time: shard 0 [0, 1] (3 rows
    # together) = 1 s, shard 1 [0.5, 2.5] = 2 s -> 4.04e10 / 3 s.
    assert hw.peak_flops == pytest.approx(4.04e10 / 3)
    # Bandwidth: each row 100 steps; per step 1e7 B of weights + KV of the rows decoding with
    # it, 200 B x (1000 + 101/2) = 210,100 B each, weighted by overlap:
    #   rows A, B [1.5, 11.5]: A + B + half of D [6.5, 16.5] = 2.5 x 210,100 -> 10,525,250 B
    #   row D: half of A, half of B, itself = 2 x 210,100 -> 10,420,200 B
    #   row C (shard 1, alone): 10,210,100 B
    #   (2 x 100 x 10,525,250 + 100 x 10,420,200 + 100 x 10,210,100) B / (4 x 10 s) = 1.04202e8 B/s
    assert hw.mem_bw == pytest.approx((2 * 10_525_250 + 10_420_200 + 10_210_100) * 100 / 40)
    # Link: 4 x 200 B x 1000 tokens over hand-off busy time 0.5 s + 0.5 s = 8e5 B/s.
    assert hw.link_bw == pytest.approx(8e5)
    # Hand-off latency: each hand-off took 0.5 s, its bytes 200 B x 1000 / 8e5 B/s = 0.25 s of it.
    assert hw.handoff_s == pytest.approx(0.25)
    assert (hw.mfu, hw.mbu, hw.kv_cache_bytes) == (1.0, 1.0, HARDWARE["cpu"].kv_cache_bytes)
    # The run's own workload: 4 good rows, the error row left out.
    wl = workload_from_run(tmp_path)
    assert (wl.count, wl.mean_prompt, wl.mean_output) == (4, 1000, 101)


def _record(shard: str, ps: float, pe: float, t1: float, tn: float) -> dict:
    return dict(key=f"{shard}:0", shard=shard, row=0, prefill_worker="prefill-0@h", decode_worker="decode-0@h",
                read_at=0.0, prefill_start=ps, prefill_end=pe, decode_arrived_at=pe,
                token_times=[t1 + (tn - t1) * i / 100 for i in range(101)], prompt_tokens=1000,
                output_tokens=101, kv_tokens=1000, kv_bytes=200_000, tries=1)


def test_calibrate_from_request_metrics_uses_one_clock(tmp_path):
    # Two shards on one prefill worker, both rows entering prefill at 0: A is prefilled over
    # [0, 1], B waits for it and ends at 2. On one clock the engine was busy 2 s, not 1 + 2 s.
    write_request_metrics(tmp_path, "a.parquet", [_record("a.parquet", 0.0, 1.0, 2.5, 12.5)])
    write_request_metrics(tmp_path, "b.parquet", [_record("b.parquet", 0.0, 2.0, 3.0, 13.0)])
    hw = calibrate(tmp_path, TOY, "cpu")
    # FLOP/s: 2 x 1.01e10 / 2 s = 1.01e10 (from output shards alone: 2.02e10 / 3 s).
    assert hw.peak_flops == pytest.approx(1.01e10)
    # Decoding on one worker: A [2.5, 12.5], B [3, 13] overlap 9.5 of 10 s, so each step reads
    # 1e7 B + 210,100 B x (1 + 0.95); 2 x 100 steps over 20 s: 10 x 10,409,695 B/s.
    assert hw.mem_bw == pytest.approx(10 * (1e7 + 210_100 * 1.95))
    # Hand-offs A [1, 2.5], B [2, 3]: union 2 s for 2 x 2e5 B -> 2e5 B/s, so moving 2e5 B takes
    # 1 s; latency = mean(1.5 - 1, 1 - 1) = 0.25 s.
    assert hw.link_bw == pytest.approx(2e5)
    assert hw.handoff_s == pytest.approx(0.25)


def test_calibrated_rates_are_per_device_of_each_pool(tmp_path):
    """The run above, made on GPUs (an h100 profile to fit) with prefill workers of TP 3 and
    decode workers of TP 1 (its config.yaml): the FLOP/s a prefill worker reached is three
    devices' worth, so the profile's is a third of it; the decode and link rates are one
    device's (min(3, 1) links per hand-off). Predicting that same shape multiplies them back: a
    prefill of the same prompt takes as long as measured. Fitted to the cpu profile, where a
    worker's ranks share its cores, the rates stay per worker."""
    import dataclasses

    from pipeline.config import compose, to_yaml
    from pipeline.plan.costs import prefill_time

    write_request_metrics(tmp_path, "a.parquet", [_record("a.parquet", 0.0, 1.0, 2.5, 12.5)])
    write_request_metrics(tmp_path, "b.parquet", [_record("b.parquet", 0.0, 2.0, 3.0, 13.0)])
    cfg = compose(["+job=summarize", "model.prefill_tp=3"])
    (tmp_path / "config.yaml").write_text(to_yaml(dataclasses.replace(
        cfg, job=dataclasses.replace(cfg.job, output=str(tmp_path / "output")))))
    assert calibrate(tmp_path, TOY, "cpu").peak_flops == pytest.approx(1.01e10)
    hw = calibrate(tmp_path, TOY, "h100")
    assert hw.peak_flops == pytest.approx(1.01e10 / 3)
    assert hw.mem_bw == pytest.approx(10 * (1e7 + 210_100 * 1.95))
    assert hw.link_bw == pytest.approx(2e5)
    assert prefill_time(TOY, hw, 1000, tp=3) == pytest.approx(1.0)  # 1.01e10 FLOPs at 1.01e10 FLOP/s


def _shards_of_the_first_test(path: Path) -> None:
    """The output shards of test_calibrate_fits_flops_bandwidth_and_link_by_hand (4.04e10 / 3 FLOP/s)."""
    row = dict(prompt_tokens=1000, output_tokens=101, queue_s=0.0, prefill_s=1.0, ttft_s=1.5,
               decode_s=10.0, kv_handoff_s=0.5)
    _shard(path / "part-00000.parquet", [row, row, {**row, "ttft_s": 6.5}])
    _shard(path / "part-00001.parquet", [{**row, "queue_s": 0.5, "prefill_s": 2.0, "ttft_s": 2.5}])


def test_request_metrics_that_cannot_be_read_fall_back_to_the_shards_and_say_why(tmp_path, caplog):
    """A metrics part of another schema version (token_times as text): Arrow cannot cast it, the
    output shards are used (the fit worked by hand above), and a warning gives Arrow's error."""
    import logging

    from pipeline.io.metrics import REQUEST_SCHEMA

    _shards_of_the_first_test(tmp_path)
    part = tmp_path / "metrics" / "requests" / "part-00000.parquet" / "part-old.parquet"
    part.parent.mkdir(parents=True)
    pq.write_table(pa.table({"key": ["part-00000.parquet:0"], "token_times": ["1.0 2.0"]}), part)
    with pytest.raises(pa.ArrowException) as arrow:
        pq.read_table(part, schema=REQUEST_SCHEMA)
    caplog.set_level(logging.WARNING, "pipeline.plan.calibrate")
    assert calibrate(tmp_path, TOY, "cpu").peak_flops == pytest.approx(4.04e10 / 3)
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.plan.calibrate"]
    assert len(said) == 1 and str(arrow.value) in said[0] and str(part.parents[1]) in said[0], said


def test_a_bug_while_reading_request_metrics_is_not_hidden_behind_the_shards(tmp_path, monkeypatch):
    """A test double, on purpose: the real reader has no bug to trigger, so one that raises
    TypeError stands in for one; calibrating must raise it, not fit coarser shard timings."""
    import pipeline.io.metrics

    _shards_of_the_first_test(tmp_path)
    write_request_metrics(tmp_path, "a.parquet", [_record("a.parquet", 0.0, 1.0, 2.5, 12.5)])

    def buggy(run_path):
        raise TypeError("a bug in the reader")

    monkeypatch.setattr(pipeline.io.metrics, "read_request_metrics", buggy)
    with pytest.raises(TypeError, match="a bug in the reader"):
        calibrate(tmp_path, TOY, "cpu")
