"""The DRAM tier's block layout and NIXL descriptor lists, against hand-worked addresses."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.engine.dram_pool import BlockRegions, copy_blocks, descriptors, runs


def test_runs_coalesce_only_where_both_sides_are_consecutive():
    assert runs([4, 5, 6, 9], [0, 1, 2, 3]) == [(4, 0, 3), (9, 3, 1)]
    assert runs([1, 2, 3], [7, 9, 10]) == [(1, 7, 1), (2, 9, 2)]
    assert runs([], []) == []
    with pytest.raises(ValueError):
        runs([1], [1, 2])


def test_kv_cache_regions_k_and_v_apart():
    """(2, num_blocks, ...) per layer (K and V apart, as in FlashAttention's layout):
    two regions per layer, in layer-name order; block bytes = 4 x 2 x 4 B."""
    layers = {f"layer.{i}": torch.zeros(2, 10, 4, 2, dtype=torch.float32) for i in range(3)}
    r = BlockRegions.from_kv_caches(layers, 10)
    assert r.block_bytes == 32 and len(r.bases) == 6 and r.slot_bytes == 192
    assert r.bases[0] == layers["layer.0"].data_ptr()
    assert r.bases[1] == layers["layer.0"].data_ptr() + 10 * 32


def test_kv_cache_region_k_and_v_together():
    layers = {"l": torch.zeros(10, 2, 4, dtype=torch.float16)}  # (num_blocks, 2, ...)
    r = BlockRegions.from_kv_caches(layers, 10)
    assert (len(r.bases), r.block_bytes) == (1, 16)
    with pytest.raises(ValueError, match="no block dimension"):
        BlockRegions.from_kv_caches({"l": torch.zeros(3, 4, 10)}, 10)


def test_descriptors_hand_worked():
    """2 regions x 100-byte blocks; pool of 8 slots at 10_000: slot s of region r at
    10_000 + (r x 8 + s) x 100. Blocks [3, 4, 7] -> slots [0, 1, 2]: runs (3->0, 2) and (7->2, 1)."""
    src = BlockRegions([1000, 5000], 100, 20)
    dst = BlockRegions.pool(10_000, 200, 2, 8)
    s, d = descriptors(src, [3, 4, 7], dst, [0, 1, 2])
    np.testing.assert_array_equal(s, [[1300, 200, 0], [1700, 100, 0], [5300, 200, 0], [5700, 100, 0]])
    np.testing.assert_array_equal(d, [[10_000, 200, 0], [10_200, 100, 0], [10_800, 200, 0], [11_000, 100, 0]])
    with pytest.raises(ValueError, match="layouts differ"):
        descriptors(BlockRegions([0], 100, 4), [0], dst, [0])


def test_copy_blocks_round_trip_through_a_pool():
    """KV blocks -> pool -> other KV blocks: the bytes arrive where the layout says."""
    kv = {f"l{i}": torch.arange(2 * 6 * 8, dtype=torch.float32).reshape(2, 6, 8) + 1000 * i for i in range(2)}
    src = BlockRegions.from_kv_caches(kv, 6)
    pool_t = torch.zeros(4 * src.slot_bytes, dtype=torch.uint8)
    pool = BlockRegions.pool(pool_t.data_ptr(), src.slot_bytes, len(src.bases), 4, pool_t)
    out = {k: torch.zeros_like(v) for k, v in kv.items()}
    dst = BlockRegions.from_kv_caches(out, 6)
    copy_blocks(src, [1, 2, 5], pool, [3, 0, 1])
    copy_blocks(pool, [3, 0, 1], dst, [0, 4, 2])
    for k in kv:
        for kvi in range(2):
            assert torch.equal(out[k][kvi, 0], kv[k][kvi, 1])
            assert torch.equal(out[k][kvi, 4], kv[k][kvi, 2])
            assert torch.equal(out[k][kvi, 2], kv[k][kvi, 5])
            assert not out[k][kvi, 1].any()


def test_pools_of_different_tp_meet_in_the_pool_each_rank_its_heads():
    """A TP-3 engine's ranks each hold 1 of 3 KV heads of a block laid out head by head
    ([blocks, heads, block_size, head_size], vLLM's CPU attention); each writes its shard into a
    pool that holds every head, and a TP-1 engine reads back the whole blocks, byte for byte
    those of a TP-1 engine that held all three heads. Then the reverse: TP 1 writes, 3 ranks
    read their own heads. Descriptors of a shard are per block (its blocks are a slot apart)."""
    heads, blocks, tokens, dim = 3, 5, 4, 2
    whole = {f"l{i}": torch.arange(blocks * heads * tokens * dim, dtype=torch.float32).reshape(
        blocks, heads, tokens, dim) + 1000 * i for i in range(2)}
    ranks = [{k: v[:, r:r + 1].contiguous() for k, v in whole.items()} for r in range(heads)]
    slot = BlockRegions.from_kv_caches(whole, blocks).slot_bytes
    pool_t = torch.zeros(4 * slot, dtype=torch.uint8)
    pool = BlockRegions.pool(pool_t.data_ptr(), slot, 2, 4, pool_t)
    for r, kv in enumerate(ranks):
        copy_blocks(BlockRegions.from_kv_caches(kv, blocks), [1, 3], pool.shard(r, heads), [2, 0])
    out = {k: torch.zeros_like(v) for k, v in whole.items()}
    copy_blocks(pool, [2, 0], BlockRegions.from_kv_caches(out, blocks), [0, 4])
    for k in whole:
        assert torch.equal(out[k][0], whole[k][1]) and torch.equal(out[k][4], whole[k][3])
        assert not out[k][1:4].any()
    back = [{k: torch.zeros_like(v) for k, v in kv.items()} for kv in ranks]
    for r, kv in enumerate(back):
        copy_blocks(pool.shard(r, heads), [0, 2], BlockRegions.from_kv_caches(kv, blocks), [3, 1])
        for k in whole:
            assert torch.equal(kv[k][1, 0], whole[k][1, r]) and torch.equal(kv[k][3, 0], whole[k][3, r])
    # NIXL rows of rank 1 writing blocks [1, 2] (consecutive) into slots [2, 3]: one row per
    # block and region, 32 B each (a third of a 96-B block), at 32 B into each slot.
    src = BlockRegions([1000, 5000], 32, blocks)
    dst = BlockRegions.pool(10_000, 2 * 96, 2, 4).shard(1, 3)
    s, d = descriptors(src, [1, 2], dst, [2, 3])
    np.testing.assert_array_equal(s, [[1032, 32, 0], [1064, 32, 0], [5032, 32, 0], [5064, 32, 0]])
    np.testing.assert_array_equal(d, [[10_000 + 2 * 96 + 32, 32, 0], [10_000 + 3 * 96 + 32, 32, 0],
                                      [10_000 + 4 * 96 + 2 * 96 + 32, 32, 0], [10_000 + 4 * 96 + 3 * 96 + 32, 32, 0]])
    with pytest.raises(ValueError, match="does not split"):
        pool.shard(0, 5)


def test_pool_use_record_bounded_with_exact_peak(tmp_path, monkeypatch):
    """A real pool (shared-memory file, NIXL registration): its use record counts slots in use
    after each reservation and release, keeps the exact peak and the latest value, and stays
    bounded however many rows pass (the timeline thins out, halving when full)."""
    import asyncio

    from pipeline.engine.dram_pool import DramPool

    pool = DramPool(tmp_path / "pool.kv", 8 * 4096, 4096, "test-use-record", 1000)
    monkeypatch.setattr(DramPool, "MAX_USE_POINTS", 16)

    async def first():
        a = await pool.allocate(3, 1.0)
        b = await pool.allocate(5, 1.0)  # 8 of 8: the peak
        await pool.release(a)
        await pool.release(b)

    async def many():
        for _ in range(100):  # 200 more changes, never above 2 slots
            c = await pool.allocate(2, 1.0)
            await pool.release(c)
        await pool.allocate(1, 1.0)

    try:
        asyncio.run(first())
        early = pool.use_record()
        asyncio.run(many())
        rec = pool.use_record()
    finally:
        pool.close()
    assert (early["num_slots"], early["slot_bytes"], early["peak_slots"]) == (8, 4096, 8)
    assert [u for _, u in early["use"]] == [0, 3, 8, 5, 0]
    used = [u for _, u in rec["use"]]
    assert rec["peak_slots"] == 8 and used[0] == 0 and used[-1] == 1  # the latest: 1 slot still held
    assert len(rec["use"]) <= 16 + 1 and set(used) <= {0, 1, 2, 3, 5, 8}
    times = [t for t, _ in rec["use"]]
    assert times == sorted(times)
