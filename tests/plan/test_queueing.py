"""Queueing formulas (pipeline/plan/queueing.py), each checked against a hand computation."""

from __future__ import annotations

import pytest

from pipeline.plan.queueing import batch_ttft, dram_full_probability, erlang_c, md1_wait, mg1_wait, mmc_in_system


def test_md1_wait_hand_computed():
    # rho = 0.5, S = 2 s: mu = 0.5 /s, Wq = rho / (2 mu (1 - rho)) = 0.5 / (2 x 0.5 x 0.5) = 1.0 s.
    assert md1_wait(0.5, 2.0) == pytest.approx(1.0)
    # rho = 0.75, S = 1 s: Wq = 0.75 / (2 x 1 x 0.25) = 1.5 s.
    assert md1_wait(0.75, 1.0) == pytest.approx(1.5)
    # M/G/1 (Pollaczek-Khinchine), services 1 s and 3 s, 0.25 req/s: E[S] = 2, E[S^2] = 5,
    # rho = 0.5, Wq = 0.25 x 5 / (2 x 0.5) = 1.25 s; equal services reduce to M/D/1.
    assert mg1_wait(0.25, [1.0, 3.0]) == pytest.approx(1.25)
    assert mg1_wait(0.75, [1.0]) == pytest.approx(md1_wait(0.75, 1.0))
    with pytest.raises(ValueError, match="overloaded"):
        md1_wait(1.0, 1.0)
    with pytest.raises(ValueError, match="overloaded"):
        mg1_wait(0.5, [1.0, 3.0])


def test_erlang_c_and_dram_full_probability_hand_computed():
    # M/M/1 (c = 1): P(wait) = rho = 0.5.
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    # c = 2, a = 1 erlang: (a^2/2! x c/(c-a)) / (1 + a + a^2/2! x c/(c-a)) = 1 / (1 + 1 + 1) = 1/3.
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="overloaded"):
        erlang_c(2, 2.0)
    # c = 2, a = 1, in the system (waiting or served): p0 = 1 / (1 + 1 + (1/2) / (1 - 1/2)) = 1/3;
    # P(1) = 1/3, P(2) = (1/3)(1/2) = 1/6, P(3) = 1/12: they sum to 1.
    assert mmc_in_system(2, 1.0, 4) == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 12])
    assert sum(mmc_in_system(2, 1.0, 200)) == pytest.approx(1.0)
    # Nothing upstream: P(Ns >= 1) = 2/3, P(Ns >= 3) = 1 - 1/3 - 1/3 - 1/6 = 1/6.
    assert dram_full_probability(2, 1.0, 0.0, 1) == pytest.approx(2 / 3)
    assert dram_full_probability(2, 1.0, 0.0, 3) == pytest.approx(1 / 6)
    # With 0.5 requests upstream (Poisson): P(Ns + Nu >= 1) = 1 - (1/3) x e^-0.5 = 0.797823.
    assert dram_full_probability(2, 1.0, 0.5, 1) == pytest.approx(0.797823, abs=1e-6)
    assert dram_full_probability(2, 1.0, 0.5, 0) == 1.0


def test_batch_ttft_first_batch_then_the_response_time_law():
    # 3 rows in flight, S = 1 s, H = 0.5 s, D = 1 s, X = 1 req/s (prefill-bound):
    #   first three: 1 x 1 + 0.5, 2 + 0.5, 3 + 0.5 = 1.5, 2.5, 3.5 s;
    #   later ones: b / X - D = 3 / 1 - 1 = 2 s (>= S + H = 1.5 s).
    # 5 rows: [1.5, 2.5, 3.5, 2, 2]: mean 11.5 / 5 = 2.3 s, median 2 s.
    assert batch_ttft(5, 3, 1.0, 0.5, 1.0, 1.0) == pytest.approx((2.3, 2.0))
    # 4 rows: [1.5, 2.5, 3.5, 2]: mean 2.375 s, median (2 + 2.5) / 2 = 2.25 s.
    assert batch_ttft(4, 3, 1.0, 0.5, 1.0, 1.0) == pytest.approx((2.375, 2.25))
    # Rows in flight >= rows: all queue at once, [1.5, 2.5, 3.5, 4.5]: mean (n + 1) / 2 x S + H
    # = 2.5 + 0.5 = 3 s for n = 4, median (2.5 + 3.5) / 2 = 3 s.
    assert batch_ttft(4, 16, 1.0, 0.5, 1.0, 1.0) == pytest.approx((3.0, 3.0))
    # A slow loop (X = 0.5 req/s, D = 5 s): 3 / 0.5 - 5 = 1 s < S + H, so no wait: 1.5 s.
    assert batch_ttft(5, 3, 1.0, 0.5, 5.0, 0.5) == pytest.approx(((1.5 + 2.5 + 3.5 + 3.0) / 5, 1.5))
    with pytest.raises(ValueError, match="throughput"):
        batch_ttft(5, 3, 1.0, 0.5, 1.0, 0.0)
