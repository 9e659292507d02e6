"""Queueing formulas (pipeline/plan/queueing.py), each checked against a hand computation."""

from __future__ import annotations

import pytest

from pipeline.plan.queueing import dram_full_probability, erlang_c, md1_wait, mg1_wait


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
    # c = 2, a = 1, nothing in transit: P(Nq >= j) = C rho^j = (1/3) x 0.5^j.
    assert dram_full_probability(2, 1.0, 0.0, 1) == pytest.approx(1 / 6)
    assert dram_full_probability(2, 1.0, 0.0, 3) == pytest.approx(1 / 24)
    # With 0.5 requests in transit (Poisson): P(Nq + Nt >= 1) = 1 - (5/6) x 0.606531 = 0.494558.
    assert dram_full_probability(2, 1.0, 0.5, 1) == pytest.approx(0.494558, abs=1e-6)
    assert dram_full_probability(2, 1.0, 0.5, 0) == 1.0
