"""Predictions of one pool configuration (pipeline/plan/predict.py) for the toy model
(tests/plan/toy.py), worked by hand."""

from __future__ import annotations

import pytest

from pipeline.plan.hardware import Hardware
from pipeline.plan.predict import predict
from tests.plan.toy import TOY, TOY_HW, toy_load


def test_predict_rate_hand_computed_and_overload_messages():
    wl = toy_load(rate=1.5)
    p = predict(TOY, TOY_HW, wl, "disaggregated", prefill=2, decode=2)
    # per prefill worker 0.75 req/s, S = 1 s: rho = 0.75, Wq = 1.5 s; TTFT = 1.5 + 1 + 0.002 s.
    assert p.prefill_util == pytest.approx(0.75)
    assert p.ttft_s == pytest.approx(2.502)
    # per decode worker r = 75 tokens/s: n = 7.5 / (1 - 0.1575) = 8.9021, ITL = 0.118694 s;
    # decode utilisation = n / max batch 24 = 0.3709 (KV: 8.9 x 210 kB / 10 MB = 0.19).
    assert p.running == pytest.approx(7.5 / 0.8425)
    assert p.itl_s == pytest.approx(0.1 + 0.0021 * 7.5 / 0.8425)
    assert p.decode_util == pytest.approx(7.5 / 0.8425 / 24)
    # 1 prefill worker at 1.5 req/s x 1 s: rho = 1.5 -> needs at least 2.
    with pytest.raises(ValueError, match=r"prefill pool overloaded.*at least 2"):
        predict(TOY, TOY_HW, wl, "disaggregated", prefill=1, decode=2)
    # 3 req/s on 1 decode worker: r = 300, n = 30 / 0.37 = 81 > 24 sequences; 2 workers:
    # n = 21.9 <= 24 -> needs at least 2.
    with pytest.raises(ValueError, match=r"decode pool overloaded.*at least 2"):
        predict(TOY, TOY_HW, toy_load(rate=3.0), "disaggregated", prefill=4, decode=1)


def test_a_kv_cache_smaller_than_one_request_is_a_value_error():
    # A KV space smaller than one request (1000 + 100 tokens x 200 B = 220 kB).
    tiny = Hardware("tiny", 1e10, 1e8, 1e9, 1e8, kv_cache_bytes=1e5)
    with pytest.raises(ValueError, match="less than one request"):
        predict(TOY, tiny, toy_load(rate=0.1))


def test_batch_rows_in_flight_hand_computed():
    # 8 requests, 1P:1D, S = 1 s, H = T = 2 ms; decode step 0.1 + 0.0021 n s.
    wl = toy_load(count=8)
    # Unbounded: all 8 queue for prefill; decode runs n = 8 (ITL 0.1168 s, 11.68 s a request).
    # TTFT j x 1 s + 2 ms, j = 1..8: mean = median = 4.5 + 0.002 s; makespan prefill-bound
    # 8 + 0.002 + 11.68 = 19.682 s.
    free = predict(TOY, TOY_HW, wl, "disaggregated", 1, 1)
    assert (free.ttft_s, free.ttft_p50_s, free.makespan_s) == pytest.approx((4.502, 4.502, 19.682))
    # 2 rows in flight: decode runs n = 2 (ITL 0.1042 s, Dr = 10.42 s). A row holds its place
    # 1 + 0.002 + 10.42 = 11.422 s, so waves of 2: the 8th is the 2nd of the 4th wave:
    # 2 x 1 + 3 x 11.422 + 0.002 + 10.42 = 46.688 s (prefill-bound 18.422 s, decode-bound
    # 1.002 + 4 x 10.42 = 42.682 s). X = min(1, 2 / 11.422, 2 / 10.42) = 0.1751 req/s: later rows
    # wait 2 / X - 10.42 = 1.002 s (= S + H): TTFT [1.002, 2.002, 1.002 x 6], mean 1.127 s.
    two = predict(TOY, TOY_HW, wl, "disaggregated", 1, 1, rows_in_flight=2)
    assert two.running == pytest.approx(2)
    assert two.makespan_s == pytest.approx(46.688)
    assert (two.ttft_s, two.ttft_p50_s) == pytest.approx((1.127, 1.002))
    # 32 requests, 16 in flight: decode n = min(24, 32, 16) = 16; at the feed of 1 req/s Little
    # gives 12.66 < 16, so ITL = 0.1 + 0.0021 x 12.658 = 0.12658 s, Dr = 12.658 s. X = min(1,
    # 16 / 13.66, 16 / 13.36) = 1 (prefill-bound): later rows wait 16 / 1 - 12.658 = 3.342 s.
    # TTFT: j + 0.002 for j = 1..16, then 16 x 3.342: mean (136 + 0.032 + 53.47) / 32 = 5.922 s;
    # the median is 3.342 s (3 values below it). Makespan 32 + 0.002 + 12.658 = 44.66 s.
    busy = predict(TOY, TOY_HW, toy_load(count=32), "disaggregated", 1, 1, rows_in_flight=16)
    dr = 100 * (0.1 + 0.0021 * 10 / 0.79)
    assert busy.ttft_p50_s == pytest.approx(16 - dr)
    assert busy.ttft_s == pytest.approx((136 + 16 * 0.002 + 16 * (16 - dr)) / 32)
    assert busy.makespan_s == pytest.approx(32.002 + dr)
    with pytest.raises(ValueError, match="rows in flight"):
        predict(TOY, TOY_HW, wl, "disaggregated", 1, 1, rows_in_flight=0)
