"""KV-sized buffers of ``tools/bench_kv.py``: page-aligned memory, descriptor layouts (a whole
buffer, or one descriptor per KV block), fill patterns and digests in block order."""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass

import numpy as np

MiB = 1 << 20
# SmolLM2-135M: 2 (K and V) x 3 KV heads x 64 head dim x 2 bytes (bf16), per token and layer; x 30
# layers = 23,040 bytes per token (pipeline.engine.kv_layout.kv_bytes_per_token(30, 3, 64, "bfloat16")).
KV_BYTES_PER_TOKEN_PER_LAYER = 2 * 3 * 64 * 2
PERM_SEED = 1234


@dataclass(frozen=True)
class Layout:
    """``name``: ``whole`` or tokens per block; ``block_bytes``: bytes per descriptor (None:
    one descriptor for the whole transfer)."""

    name: str
    block_bytes: int | None

    def split(self, nbytes: int) -> tuple[int, int]:
        """(descriptor count, bytes per descriptor) covering at most ``nbytes`` bytes.

        Raises:
            ValueError: ``nbytes`` is smaller than one block.
        """
        if self.block_bytes is None:
            return 1, nbytes
        n = nbytes // self.block_bytes
        if n < 1:
            raise ValueError(f"{nbytes} B is smaller than one {self.block_bytes} B block")
        return n, self.block_bytes


def parse_layout(spec: str) -> Layout:
    """``whole``, or a block size in tokens (``16`` -> 16 x 768 = 12,288 B descriptors).

    Raises:
        ValueError: neither.
    """
    if spec == "whole":
        return Layout("whole", None)
    if not spec.isdigit() or int(spec) <= 0:
        raise ValueError(f"layout must be 'whole' or a block size in tokens > 0, got {spec!r}")
    return Layout(spec, int(spec) * KV_BYTES_PER_TOKEN_PER_LAYER)


def permutation(n: int) -> np.ndarray:
    """Target block index for each initiator block index (fixed seed; [0] for n == 1)."""
    return np.random.default_rng(PERM_SEED).permutation(n) if n > 1 else np.zeros(1, np.int64)


def fill_pattern(buf: np.ndarray, nbytes: int, seed: int) -> None:
    """Write ``nbytes`` (a multiple of 8) in which every 8-byte word differs, so that a block
    landing in the wrong place changes the digest."""
    words = buf[:nbytes].view(np.uint64)
    words[:] = np.arange(words.size, dtype=np.uint64)
    words += np.uint64(seed << 40)


def logical_digest(buf: np.ndarray, n: int, block: int, order: np.ndarray | None) -> str:
    """SHA-256 of ``n`` blocks of ``block`` bytes taken in ``order`` (None: as laid out)."""
    data = buf[: n * block]
    if order is not None and n > 1:
        data = data.reshape(n, block)[order]
    return hashlib.sha256(memoryview(np.ascontiguousarray(data))).hexdigest()


def page_buffer(nbytes: int, thp: bool = False) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned anonymous memory with every page touched (no page faults while timing);
    ``thp``: ask for transparent huge pages first (``madvise(MADV_HUGEPAGE)``)."""
    mm = mmap.mmap(-1, nbytes)
    if thp and hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    arr = np.frombuffer(mm, dtype=np.uint8)
    arr[:] = 1
    return mm, arr


def descs(base: int, blocks: np.ndarray, block: int) -> np.ndarray:
    """Nx3 (address, length, device id) rows for ``blocks`` of ``block`` bytes from ``base``."""
    n = blocks.size
    addr = np.uint64(base) + blocks.astype(np.uint64) * np.uint64(block)
    return np.stack([addr, np.full(n, block, np.uint64), np.zeros(n, np.uint64)], 1)
