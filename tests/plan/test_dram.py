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
                    itl_s=0.00999, ttft_s=5.0):
    """A disaggregated prediction of the toy model with chosen numbers (so the DRAM tier can be
    worked by hand independently of the pool model)."""
    return Prediction(
        mode="disaggregated", prefill_workers=prefill_workers, decode_workers=decode_workers, tp=1,
        throughput=rate or 1.0, prefill_s=prefill_s, prefill_p99_s=prefill_s, kv_bytes=2e5,
        kv_transfer_s=transfer_s, prefill_util=0.5, queue_wait_s=0.0, ttft_s=ttft_s, running=1.0,
        itl_s=itl_s, itl_worst_s=itl_s, decode_util=0.5, stall_fraction=0.0, output_tokens_per_s=100.0)


# The toy model with a host tier: KV 200 B/token, KV cache 650,000 B, host link 2e8 B/s, 2 devices
# and 1e6 B of DRAM per node. Requests of 1000 + 100 tokens:
#   whole request 200 x 1100 = 220,000 B; prompt 200 x 1000 = 200,000 B
#   slots = floor(650,000 / 220,000) = 2 at full length; floor(650,000 / 200,000) = 3 at prompt
#   length -> up to 1 swapped out
#   load = 200,000 B / 2e8 B/s = 1 ms; a slot is held 1 ms + 100 x 9.99 ms = 1.0 s
DRAM_HW = replace(TOY_HW, kv_cache_bytes=6.5e5, h2d_bw=2e8, node_devices=2, node_dram_bytes=1e6)


def test_dram_tier_rate_hand_computed():
    # 3 req/s over 3 decode workers: 1 req/s each; a = 1 req/s x 1.0 s = 1 erlang on c = 2 slots:
    #   Erlang C = 1/3, Wq = (1/3) x 1.0 s / (2 - 1) = 0.3333 s; waiting (Little) 1 x 0.3333 = 1/3
    #   transit (pushing 2 ms + loading 1 ms) = 1 x 0.003 = 0.003; + 1 swapped out
    #   staged = 1.336333; x 1.2 = 1.6036 -> 2 requests = 440,000 B per worker;
    #   a node holds 2 // 1 = 2 workers: 880,000 B <= 1e6 B; 3 workers -> 2 nodes.
    wl = workload(1000, 100, rate=3.0)
    d = dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=1.2, itl_target_s=0.1)
    assert d.request_bytes == 220_000 and d.load_bytes == 200_000
    assert (d.slots, d.admitted, d.swapped) == (2, 3, 1)
    assert d.load_s == pytest.approx(0.001)
    assert d.residence_s == pytest.approx(1.0)
    assert d.offered == pytest.approx(1.0)
    assert d.wait_probability == pytest.approx(1 / 3)
    assert d.admit_wait_s == pytest.approx(1 / 3)
    assert d.waiting == pytest.approx(1 / 3)
    assert d.transit == pytest.approx(0.003)
    assert d.staged == pytest.approx(1 / 3 + 0.003 + 1)
    assert d.sized_requests == 2
    assert d.worker_bytes == 440_000
    assert (d.workers_per_node, d.decode_nodes) == (2, 2)
    assert d.node_bytes == 880_000 and d.fits
    # Room for 2 - 1 swapped = 1 more: P(Nq + Nt >= 1) = 1 - (1 - 1/6) e^-0.003 = 0.169163.
    assert d.full_probability == pytest.approx(0.169163, abs=1e-6)
    # <= 1%: P(Nq >= 5) = (1/3) / 32 = 1.04% is too many, P(Nq >= 6) = 0.52% (+ < 0.01% from
    # transit) is enough -> room 6 + 1 swapped = 7 requests.
    assert d.sized_1pct == 7
    # The load spans 1 / 9.99 = 0.1 decode step; not overlapped, a gap of 10.99 ms; TTFT 5 s +
    # 0.3333 s + 1 ms; the host link is busy 1 req/s x 1 ms = 0.1% of the time.
    assert d.load_steps == pytest.approx(0.001 / 0.00999)
    assert d.blocking_itl_s == pytest.approx(0.01099)
    assert d.ttft_s == pytest.approx(5.0 + 1 / 3 + 0.001)
    assert d.h2d_util == pytest.approx(0.001)
    # Headroom 2: ceil(2 x 1.336333) = 3 requests; a node of 2 workers needs 1,320,000 B > 1e6 B.
    big = dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=2.0)
    assert big.sized_requests == 3 and big.node_bytes == 1_320_000
    assert not big.fits and any("exceed" in n for n in big.notes)
    # 2 req/s per worker: a = 2 erlangs on 2 slots -> unbounded backlog, reported, not sized.
    over = dram_tier(TOY, DRAM_HW, workload(1000, 100, rate=2.0), _dis_prediction(1, 1, rate=2.0))
    assert over.sized_requests is None and over.admit_wait_s == float("inf")
    assert any("overloaded" in n for n in over.notes)
    with pytest.raises(ValueError, match="headroom"):
        dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=0.5)


def test_dram_tier_batch_backlog_hand_computed():
    # 1000 requests, 1P:1D, prefill 0.1 s each -> 10 req/s for P = 100 s. With both slots busy a
    # step is 0.1 + 0.0021 x 2 = 0.1042 s (memory bound, the toy's line), so a slot is held
    # 1 ms + 100 x 0.1042 s = 10.421 s and decode completes mu = 2 / 10.421 = 0.191920 req/s.
    # Peak backlog at the end of prefill: 1000 - 2 - 0.191920 x (100 - 10.421) = 980.808;
    # + transit 10 x 3 ms = 0.03, + 1 swapped = 981.838; x 1.2 = 1178.2 -> 1179 requests.
    wl = workload(1000, 100, count=1000)
    d = dram_tier(TOY, DRAM_HW, wl, _dis_prediction(1, 1, rate=None, prefill_s=0.1), headroom=1.2)
    mu = 2 / 10.421
    assert d.rate == pytest.approx(10.0)
    assert d.itl_s == pytest.approx(0.1042)
    assert d.residence_s == pytest.approx(10.421)
    assert d.waiting == pytest.approx(998 - mu * (100 - 10.421))
    assert d.admit_wait_s == pytest.approx(d.waiting / (2 * mu))
    assert d.staged == pytest.approx(998 - mu * 89.579 + 0.03 + 1)
    assert d.sized_requests == 1179
    assert d.full_probability is None and d.sized_1pct is None
    assert any("decode is the bottleneck" in n for n in d.notes)
    # 10 requests: all prefilled in 1 s, sooner than a slot frees (10.4 s): 10 - 2 = 8 wait.
    small = dram_tier(TOY, DRAM_HW, workload(1000, 100, count=10),
                        _dis_prediction(1, 1, rate=None, prefill_s=0.1))
    assert small.waiting == pytest.approx(8.0)


def test_node_dram_from_preset_or_proc_meminfo():
    assert node_dram(hardware("h200")) == 2 * 2**40 == node_dram(hardware("h100"))
    # cpu: this machine's MemTotal; the kernel's page count says the same.
    assert node_dram(hardware("cpu")) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
