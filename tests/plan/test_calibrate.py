"""Calibration from a run's output shards (pipeline/plan/calibrate.py), fitted to a made-up run
of the toy model (tests/plan/toy.py) and worked by hand."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
    _shard(tmp_path / "shard-00000.parquet", [row, row, {**row, "ttft_s": 6.5}])
    _shard(tmp_path / "shard-00001.parquet", [{**row, "queue_s": 0.5, "prefill_s": 2.0, "ttft_s": 2.5},
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
    assert (hw.mfu, hw.mbu, hw.kv_cache_bytes) == (1.0, 1.0, HARDWARE["cpu"].kv_cache_bytes)
    # The run's own workload: 4 good rows, the error row left out.
    wl = workload_from_run(tmp_path)
    assert (wl.count, wl.mean_prompt, wl.mean_output) == (4, 1000, 101)
