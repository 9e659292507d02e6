"""The split and the recommendation (pipeline/plan/recommend.py) for the toy model
(tests/plan/toy.py), worked by hand."""

from __future__ import annotations

import pytest

from pipeline.plan.recommend import plan
from tests.plan.toy import TOY, TOY_HW, toy_load


def test_xp_yd_split_hand_worked():
    # 1.5 req/s, target 0.75:
    #  x = ceil(1.5 x 1 s / 0.75) = 2;
    #  y = 1: n = 21.90 -> 21.90 / 24 = 0.91 > 0.75; y = 2: n = 8.90 -> 0.37 <= 0.75 -> 2P:2D.
    #  colocated: 2 workers: rho = 0.75, gaps x4, r = 0.75 x 100 x 4 = 300 -> n = 81 > 24;
    #  3 workers: rho = 0.5, r = 0.5 x 100 x 2 = 100 -> n = 10 / 0.79 = 12.66 -> 0.53 -> x3.
    #  colocated step = 0.1 + 0.0021 x 12.66 = 0.12658 s, mean ITL 2 x that, worst + S = 1.12658 s;
    #  prefills land in 0.5 req/s x 0.25316 s = 12.7% of gaps.
    result = plan(TOY, TOY_HW, toy_load(rate=1.5), target_util=0.75, itl_target_s=0.5)
    d, c = result.disaggregated, result.colocated
    assert (d.prefill_workers, d.decode_workers) == (2, 2)
    assert c.prefill_workers == 3
    step = 0.1 + 0.0021 * 10 / 0.79
    assert c.itl_s == pytest.approx(2 * step)
    assert c.itl_worst_s == pytest.approx(step + 1.0)
    assert c.stall_fraction == pytest.approx(0.5 * 2 * step)
    # worst case 1.127 s > 0.5 s target, in 12.7% of gaps: disaggregate.
    assert result.recommendation == "disaggregated"
    assert result.overrides == "pools=disaggregated pools.prefill=2 pools.decode=2"


def test_recommendation_flips_with_itl_target_and_with_load():
    # Same load, a 2 s ITL target: the colocated worst case (1.127 s) fits -> colocated x3.
    loose = plan(TOY, TOY_HW, toy_load(rate=1.5), itl_target_s=2.0)
    assert loose.recommendation == "colocated"
    assert loose.overrides == "pools=colocated pools.prefill=3"
    # The flip sits at the worst case itself.
    step = 0.1 + 0.0021 * 10 / 0.79
    assert plan(TOY, TOY_HW, toy_load(rate=1.5), itl_target_s=step + 1.0 - 1e-6).recommendation == "disaggregated"
    assert plan(TOY, TOY_HW, toy_load(rate=1.5), itl_target_s=step + 1.0 + 1e-6).recommendation == "colocated"
    # 0.01 req/s with the 0.5 s target: worst case 1.1 s > 0.5 s, but a prefill lands in
    # 0.01 x 0.1012 s = 0.1% of gaps (< 1%), so the p99 ITL is not stalled: one colocated worker.
    # (rho = 0.01, r = 0.01 x 100 / 0.99 = 1.0101, n = 0.10101 / (1 - 0.0021212) = 0.10122,
    #  mean ITL = (0.1 + 0.0021 x 0.10122) / 0.99 = 0.101225 s.)
    light = plan(TOY, TOY_HW, toy_load(rate=0.01), itl_target_s=0.5)
    assert light.recommendation == "colocated"
    assert "load too small" in light.reason
    assert light.colocated.prefill_workers == 1
    assert (light.disaggregated.prefill_workers, light.disaggregated.decode_workers) == (1, 1)
    assert light.colocated.stall_fraction == pytest.approx(0.01 * 0.101225, rel=1e-4)


def test_batch_job_makespan_hand_computed():
    # 4 requests, 2 workers, no rate.
    # 1P:1D: prefill busy 4 x 1 s = 4 s; decode runs min(24, 4) = 4 at a time:
    #   ITL = 0.1 + 0.0021 x 4 = 0.1084 s, decode busy 100 x 0.1084 = 10.84 s;
    #   makespan = max(4 + 0.002 + 10.84, 1 + 0.002 + 10.84) = 14.842 s.
    # colocated x2: 2 requests each: 2 x 1 s + 100 x (0.1 + 0.0021 x 2) = 12.42 s -> colocated.
    result = plan(TOY, TOY_HW, toy_load(count=4), workers=2)
    assert result.disaggregated.makespan_s == pytest.approx(14.842)
    assert result.colocated.makespan_s == pytest.approx(12.42)
    assert result.recommendation == "colocated"
    assert result.overrides == "pools=colocated pools.prefill=2"


def test_target_utilisation_outside_0_1_is_a_value_error():
    with pytest.raises(ValueError, match="target utilisation"):
        plan(TOY, TOY_HW, toy_load(rate=1.0), target_util=1.0)
