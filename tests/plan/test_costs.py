"""Per-request costs (pipeline/plan/costs.py) of the toy model (tests/plan/toy.py), worked by hand."""

from __future__ import annotations

import pytest

from pipeline.plan.costs import decode_concurrency, decode_step_time, prefill_flops, prefill_time
from tests.plan.toy import TOY, TOY_HW


def test_prefill_time_hand_computed():
    assert prefill_flops(TOY, 1000) == pytest.approx(1.01e10)
    assert prefill_time(TOY, TOY_HW, 1000) == pytest.approx(1.0)
    assert prefill_time(TOY, TOY_HW, 1000, tp=2) == pytest.approx(0.5)


def test_decode_concurrency_is_the_littles_law_fixed_point():
    # 1.5 req/s x 100 tokens = r = 150 tokens/s; n = r x ITL(n) = 150 x (0.1 + 0.0021 n)
    # -> n = 15 / (1 - 0.315) = 21.8978; ITL = 0.1 + 0.0021 x 21.8978 = 0.145985 s.
    n, itl = decode_concurrency(TOY, TOY_HW, 1.5, 100, 1050)
    assert n == pytest.approx(15 / 0.685)
    assert itl == pytest.approx(0.1 + 0.0021 * 15 / 0.685)
    assert n == pytest.approx(1.5 * 100 * itl)  # Little: N = lambda x W
    assert decode_step_time(TOY, TOY_HW, n, 1050) == pytest.approx(itl)
    # r x 0.0021 >= 1 (r = 500 tokens/s): more KV to read per token than the worker can: overloaded.
    with pytest.raises(ValueError, match="overloaded"):
        decode_concurrency(TOY, TOY_HW, 5.0, 100, 1050)
