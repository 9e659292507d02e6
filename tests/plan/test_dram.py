"""The decode host-DRAM KV tier (pipeline/plan/dram.py) of the toy model (tests/plan/toy.py),
worked by hand independently of the pool model."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from pipeline.plan.dram import dram_tier, node_dram
from pipeline.plan.hardware import hardware
from pipeline.plan.predict import Prediction
from pipeline.plan.workload import workload
from tests.plan.toy import TOY, TOY_HW


def _dis_prediction(prefill_workers, decode_workers, *, rate, prefill_s=1.0, transfer_s=0.002,
                    itl_s=0.00999, ttft_s=5.0, queue_wait_s=0.0, rows_in_flight=None):
    """A disaggregated prediction of the toy model with chosen numbers (so the DRAM tier can be
    worked by hand independently of the pool model)."""
    return Prediction(
        mode="disaggregated", prefill_workers=prefill_workers, decode_workers=decode_workers, prefill_tp=1, decode_tp=1,
        throughput=rate or 1.0, prefill_s=prefill_s, prefill_p99_s=prefill_s, kv_bytes=2e5,
        kv_transfer_s=transfer_s, prefill_util=0.5, queue_wait_s=queue_wait_s, ttft_s=ttft_s, running=1.0,
        itl_s=itl_s, itl_worst_s=itl_s, decode_util=0.5, stall_fraction=0.0, output_tokens_per_s=100.0,
        rows_in_flight=rows_in_flight)


# The toy model with a host tier: KV 200 B/token, KV cache 650,000 B, host link 2e8 B/s, 2 devices
# and 1.5e6 B of DRAM per node. Requests of 1000 + 100 tokens:
#   whole request 200 x 1100 = 220,000 B; prompt 200 x 1000 = 200,000 B (what DRAM holds)
#   slots = floor(650,000 / 220,000) = 2 at full length; floor(650,000 / 200,000) = 3 at prompt
#   length -> up to 1 preempted
#   load = 200,000 B / 2e8 B/s = 1 ms; a slot is held 1 ms + 100 x 9.99 ms = 1.0 s
DRAM_HW = replace(TOY_HW, kv_cache_bytes=6.5e5, h2d_bw=2e8, node_devices=2, node_dram_bytes=1.5e6)


def test_dram_tier_rate_hand_computed():
    # 3 req/s over 3 decode workers: 1 req/s each; a = 1 req/s x 1.0 s = 1 erlang on c = 2 slots:
    #   Erlang C = 1/3, Wq = (1/3) x 1.0 s / (2 - 1) = 0.3333 s.
    #   A request holds its DRAM slots from before its prefill to the end of its decode:
    #   queue 0.5 s + prefill 1.0 s + push 2 ms + Wq 0.3333 s + slot 1.0 s = 2.835333 s; by
    #   Little's law 1 req/s x that: upstream 1.502 + waiting 0.3333 + decoding 1.0 = 2.835333.
    #   x 1.2 = 3.4024 -> 4 requests x 200,000 B = 800,000 B per worker;
    #   a node holds 2 // 1 = 2 workers: 1,600,000 B > 1.5e6 B; 3 workers -> 2 nodes.
    wl = workload(1000, 100, rate=3.0)
    pred = _dis_prediction(3, 3, rate=3.0, queue_wait_s=0.5)
    d = dram_tier(TOY, DRAM_HW, wl, pred, headroom=1.2, itl_target_s=0.1)
    assert d.request_bytes == 220_000 and d.load_bytes == 200_000
    assert (d.slots, d.admitted, d.swapped) == (2, 3, 1)
    assert d.load_s == pytest.approx(0.001)
    assert d.residence_s == pytest.approx(1.0)
    assert d.offered == pytest.approx(1.0)
    assert d.wait_probability == pytest.approx(1 / 3)
    assert d.admit_wait_s == pytest.approx(1 / 3)
    assert d.hold_s == pytest.approx(0.5 + 1.0 + 0.002 + 1 / 3 + 1.0)
    assert (d.upstream, d.waiting, d.decoding) == pytest.approx((1.502, 1 / 3, 1.0))
    assert d.staged == pytest.approx(2.835333, abs=1e-6)
    assert d.in_flight is None
    assert d.sized_requests == 4
    assert d.worker_bytes == 800_000
    assert (d.workers_per_node, d.decode_nodes) == (2, 2)
    assert d.node_bytes == 1_600_000 and not d.fits and any("exceed" in n for n in d.notes)
    # Room for 4: N = Ns (M/M/2 at a = 1: P(0) = P(1) = 1/3, P(n >= 2) = (1/6) 0.5^(n-2)) + Nu
    # (Poisson, mean 1.502). P(N >= 4) = 1 - sum_{t<4} sum_j Ps(j) Pu(t - j) = 0.307767.
    assert d.full_probability == pytest.approx(0.307767, abs=1e-6)
    # <= 1%: the same sum for each room: 9 gives 1.17%, 10 gives 0.58%.
    assert d.sized_1pct == 10
    # The prefill worker keeps the KV for the push (2 ms). The load spans 1 / 9.99 = 0.1 decode
    # step; not overlapped, a gap of 10.99 ms; TTFT 5 s + 0.3333 s + 1 ms; the host link is busy
    # 1 req/s x 1 ms = 0.1% of the time.
    assert d.prefill_hold_s == pytest.approx(0.002)
    assert d.load_steps == pytest.approx(0.001 / 0.00999)
    assert d.blocking_itl_s == pytest.approx(0.01099)
    assert d.ttft_s == pytest.approx(5.0 + 1 / 3 + 0.001)
    assert d.h2d_util == pytest.approx(0.001)
    # Headroom 1 and no queue: ceil(2.335333) = 3 requests; 2 workers: 1,200,000 B fit in 1.5e6 B.
    fits = dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=1.0)
    assert fits.sized_requests == 3 and fits.node_bytes == 1_200_000 and fits.fits
    # 2 req/s per worker: a = 2 erlangs on 2 slots -> unbounded backlog, reported, not sized.
    over = dram_tier(TOY, DRAM_HW, workload(1000, 100, rate=2.0), _dis_prediction(1, 1, rate=2.0))
    assert over.sized_requests is None and over.admit_wait_s == float("inf")
    assert any("overloaded" in n for n in over.notes)
    with pytest.raises(ValueError, match="headroom"):
        dram_tier(TOY, DRAM_HW, wl, pred, headroom=0.5)


def test_dram_tier_batch_rows_in_flight_hand_computed():
    # 1000 requests, 1P:1D, prefill 0.1 s each -> 10 req/s for P = 100 s. With both slots busy a
    # step is 0.1 + 0.0021 x 2 = 0.1042 s (memory bound, the toy's line), so a slot is held
    # 1 ms + 100 x 0.1042 s = 10.421 s and decode completes mu = 2 / 10.421 = 0.191920 req/s.
    # Every row in flight holds its reservation: 16 rows in flight -> a peak of 16 requests
    # (2 decoding, 14 waiting for a slot: the fluid backlog, 980.8, is more than the rows in
    # flight allow); x 1.2 = 19.2 -> 20 requests x 200,000 B.
    wl = workload(1000, 100, count=1000)
    d = dram_tier(TOY, DRAM_HW, wl, _dis_prediction(1, 1, rate=None, prefill_s=0.1, rows_in_flight=16),
                  headroom=1.2)
    mu = 2 / 10.421
    assert d.rate == pytest.approx(10.0)
    assert d.itl_s == pytest.approx(0.1042)
    assert d.residence_s == pytest.approx(10.421)
    assert d.in_flight == d.staged == 16
    assert (d.decoding, d.waiting, d.upstream) == pytest.approx((2, 14, 0))
    assert d.admit_wait_s == pytest.approx(14 / (2 * mu))
    assert d.sized_requests == 20 and d.worker_bytes == 4_000_000
    assert d.prefill_hold_s == pytest.approx(0.002)
    assert d.full_probability is None and d.sized_1pct is None
    assert any("decode is the bottleneck" in n for n in d.notes)
    # Rows in flight unbounded: all 1000 hold DRAM; the fluid backlog at the end of prefill
    # 1000 - 2 - mu x (100 - 10.421) = 980.808 waits for a slot, the other 17.19 are upstream.
    every = dram_tier(TOY, DRAM_HW, wl, _dis_prediction(1, 1, rate=None, prefill_s=0.1), headroom=1.2)
    assert every.staged == 1000 and every.sized_requests == 1200
    assert every.waiting == pytest.approx(998 - mu * (100 - 10.421))
    assert every.upstream == pytest.approx(1000 - 2 - every.waiting)
    # 10 requests: all prefilled in 1 s, sooner than a slot frees (10.4 s): 10 - 2 = 8 wait.
    small = dram_tier(TOY, DRAM_HW, workload(1000, 100, count=10),
                      _dis_prediction(1, 1, rate=None, prefill_s=0.1))
    assert small.waiting == pytest.approx(8.0) and small.staged == 10


def test_node_dram_from_preset_or_proc_meminfo():
    assert node_dram(hardware("h200")) == 2 * 2**40 == node_dram(hardware("h100"))
    # cpu: this machine's MemTotal; the kernel's page count says the same.
    assert node_dram(hardware("cpu")) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
