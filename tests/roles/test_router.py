"""Capacity-aware routing of hand-offs (pipeline.roles.router.DecodeRouter): admission counts
KV tokens against each decode worker's published KV cache size, not requests.

The decode workers here are endpoint records in a real run directory (what a decode worker
publishes at start); no engine is needed to decide where a hand-off goes. Expected choices are
worked out by hand in the comments."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.runtime.rundir import RunDir
from pipeline.roles.errors import KVTooLarge
from pipeline.roles.router import DecodeRouter


def _clients(tmp_path, capacities: dict[int, int | None]) -> DecodeRouter:
    run = RunDir(tmp_path)
    for rank, cap in capacities.items():
        run.publish_decode(rank, f"tcp://127.0.0.1:{20000 + rank}", f"decode-{rank}@x", cap)
    return DecodeRouter(run, timeout_s=5, dead_after_s=30, secret=b"k" * 32)


def test_routes_by_free_kv_not_by_request_count(tmp_path):
    async def go():
        c = _clients(tmp_path, {0: 8192, 1: 16384})
        try:
            # Empty: (0 + 1000) / 8192 = 0.122 vs (0 + 1000) / 16384 = 0.061 -> rank 1.
            assert await c._pick(1, kv_tokens=1000) == 1
            # Rank 1 holds one 12000-token request, rank 0 holds three 500-token ones (more
            # requests, less KV): (1500 + 1000) / 8192 = 0.305 < (12000 + 1000) / 16384 = 0.793
            # -> rank 0, where counting requests would have picked rank 1.
            c.inflight_tokens = {0: 1500, 1: 12000}
            c.inflight = {0: {"a": None, "b": None, "c": None}, 1: {"d": None}}
            assert await c._pick(1, kv_tokens=1000) == 0
            # A 9000-token request fits only rank 1, however loaded.
            assert await c._pick(1, kv_tokens=9000) == 1
        finally:
            c.inflight = {}
            c.close()
    asyncio.run(go())


def test_request_no_worker_can_hold_is_refused_with_the_sizes(tmp_path):
    async def go():
        c = _clients(tmp_path, {0: 8192, 1: 4096})
        try:
            c.check_fits(8192)  # exactly the largest cache: fits
            with pytest.raises(KVTooLarge, match="KV for 8193 tokens .* holds 8192 tokens"):
                c.check_fits(8193)
            with pytest.raises(KVTooLarge):
                await c._pick(1, kv_tokens=10000)
        finally:
            c.close()
    asyncio.run(go())


def test_unknown_capacity_falls_back_to_counting_requests(tmp_path):
    async def go():
        c = _clients(tmp_path, {0: None, 1: None})  # workers that did not publish a size
        try:
            c.check_fits(10**9)  # nothing known: nothing refused
            c.inflight = {0: {"a": None}, 1: {}}
            assert await c._pick(1, kv_tokens=10**6) == 1
        finally:
            c.inflight = {}
            c.close()
    asyncio.run(go())
