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
