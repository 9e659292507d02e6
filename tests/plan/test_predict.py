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
