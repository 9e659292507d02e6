"""The decode worker's host-DRAM tier: a pool of KV block slots in shared host memory.

A prefill worker WRITEs (NIXL, RDMA on InfiniBand) a finished request's KV blocks into slots of
this pool as soon as its prefill ends, and frees its own blocks when the write completes. The
decode engine copies them from the pool into its KV cache when it admits the request, and again
if it ever preempts the request (so a preempted sequence recomputes only its generated tokens,
never its prompt). See :mod:`pipeline.engine.dram_connector` for the vLLM side.

Memory layout (the same on both sides, so the prefill worker can address slots directly):
vLLM keeps each layer's KV as one or two *regions* (K and V apart, or together) of
``num_blocks`` equal blocks. With ``R`` regions of ``b`` bytes per block, the pool holds
``S`` slots as ``R`` arrays of ``S`` blocks: slot ``s`` of region ``r`` lies at
``base + (r * S + s) * b``. A run of consecutive slots is then one contiguous range per region,
so a request whose blocks and slots are both consecutive moves as ``R`` descriptors, not
``R x blocks``.

With tensor parallelism the pool keeps this layout, every KV head in each slot: an engine of TP
``n`` holds ``1/n`` of the KV heads on each rank, and rank ``r`` writes or reads bytes ``[r b / n,
(r + 1) b / n)`` of every slot's block in each region (:meth:`BlockRegions.shard`). That is its
heads' part where a block is laid out head by head, as vLLM's CPU attention lays it out
(``[num_blocks, num_kv_heads, block_size, 2 x head_size]`` per layer); so pools of different TP
sizes meet in the pool, each side its own shards. A shard's blocks are not contiguous (they lie
one slot apart), so its descriptors are one per block and region.

The pool is a file in ``/dev/shm`` so that two processes map it: the decode role process owns it
(allocates slots, registers it with NIXL, receives the prefill workers' completion notifications)
and the engine core copies from it.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


class PoolFull(RuntimeError):
    """A request needs more slots than the whole DRAM tier has: it can never be admitted."""


@dataclass
class BlockRegions:
    """Equal-sized KV blocks laid out as ``len(bases)`` regions of ``num_blocks`` blocks each:
    block ``i`` of region ``r`` starts at byte address ``bases[r] + i * block_stride``.

    ``views`` (optional) are the same regions as ``(num_blocks, block_bytes)`` uint8 tensors,
    for local copies. ``stride``: bytes from one block to the next (0: ``block_bytes``, the
    blocks are contiguous; a :meth:`shard`'s are a whole block apart)."""

    bases: list[int]
    block_bytes: int
    num_blocks: int
    views: list["torch.Tensor"] | None = None
    device_id: int = 0
    stride: int = 0

    @property
    def block_stride(self) -> int:
        """Bytes from the start of one block to the next."""
        return self.stride or self.block_bytes

    def shard(self, rank: int, tp: int) -> "BlockRegions":
        """The part of every block that TP rank ``rank`` of ``tp`` holds: bytes ``[rank x
        block_bytes / tp, (rank + 1) x block_bytes / tp)`` of each (its KV heads, in a block laid
        out head by head; see the module doc). ``tp == 1``: these regions themselves.

        Raises:
            ValueError: the block does not split into ``tp`` equal parts.
        """
        if tp == 1:
            return self
        if self.block_bytes % tp or not 0 <= rank < tp:
            raise ValueError(f"a KV block of {self.block_bytes} bytes does not split into rank {rank} of {tp}")
        part = self.block_bytes // tp
        off = rank * part
        views = [v[:, off:off + part] for v in self.views] if self.views is not None else None
        return BlockRegions([b + off for b in self.bases], part, self.num_blocks, views, self.device_id,
                            stride=self.block_stride)

    @property
    def slot_bytes(self) -> int:
        """Bytes one block occupies across all regions (all layers, K and V)."""
        return len(self.bases) * self.block_bytes

    @classmethod
    def from_kv_caches(cls, kv_caches: dict[str, "torch.Tensor"], num_blocks: int) -> "BlockRegions":
        """The regions of vLLM's per-layer KV cache tensors (layers in name order).

        A layer tensor whose first dimension is ``num_blocks`` is one region (K and V inside each
        block); one whose second dimension is ``num_blocks`` (``(2, num_blocks, ...)``, K and V
        apart) is two.

        Raises:
            ValueError: a layer has no block dimension in front, is not contiguous, or its
                blocks differ in size from the other layers' (a hybrid model).
        """
        import torch

        views, device = [], 0
        for name in sorted(kv_caches):
            t = kv_caches[name]
            if not t.is_contiguous():
                raise ValueError(f"KV cache of {name} is not contiguous; the DRAM tier needs contiguous blocks")
            if t.shape[0] == num_blocks:
                parts = [t]
            elif t.dim() > 1 and t.shape[1] == num_blocks:
                parts = list(t.unbind(0))
            else:
                raise ValueError(f"KV cache of {name} has shape {tuple(t.shape)}: no block dimension "
                                 f"of {num_blocks} in front; the DRAM tier does not know this layout")
            for p in parts:
                views.append(p.view(torch.uint8).reshape(num_blocks, -1))
            device = t.device.index or 0
        sizes = {v.shape[1] for v in views}
        if len(sizes) != 1:
            raise ValueError(f"KV blocks differ in size across layers ({sorted(sizes)} bytes); "
                             "the DRAM tier supports models with one attention type")
        return cls([v.data_ptr() for v in views], sizes.pop(), num_blocks, views, device)

    @classmethod
    def pool(cls, base: int, slot_bytes: int, regions: int, num_slots: int,
             tensor: "torch.Tensor | None" = None) -> "BlockRegions":
        """The pool at address ``base`` (``num_slots`` slots of ``slot_bytes``, split into
        ``regions`` regions as in the module docstring). ``tensor``: the pool mapped in this
        process, to give :attr:`views`."""
        if slot_bytes % regions:
            raise ValueError(f"slot of {slot_bytes} bytes does not split into {regions} regions")
        b = slot_bytes // regions
        views = None
        if tensor is not None:
            views = [tensor[r * num_slots * b:(r + 1) * num_slots * b].view(num_slots, b) for r in range(regions)]
        return cls([base + r * num_slots * b for r in range(regions)], b, num_slots, views)


def runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """Coalesce a block-to-block mapping into ``(first src, first dst, count)`` runs where both
    sides are consecutive. ``runs([4, 5, 6, 9], [0, 1, 2, 3]) == [(4, 0, 3), (9, 3, 1)]``."""
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} source blocks for {len(dst)} destination blocks")
    out: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


def descriptors(src: BlockRegions, src_blocks: list[int], dst: BlockRegions,
                dst_blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """NIXL descriptor rows ``(address, bytes, device id)`` that move ``src_blocks`` of ``src``
    to ``dst_blocks`` of ``dst``, every region, coalesced into runs where both sides' blocks are
    contiguous (shape ``(n, 3)`` int64 each, ``n = regions x runs``), else one row per block and
    region (a :meth:`BlockRegions.shard`'s blocks lie a whole block apart).

    Raises:
        ValueError: the two sides' block layouts differ (different model, dtype or block size).
    """
    if (len(src.bases), src.block_bytes) != (len(dst.bases), dst.block_bytes):
        raise ValueError(f"KV layouts differ: {len(src.bases)} regions x {src.block_bytes} B here, "
                         f"{len(dst.bases)} x {dst.block_bytes} B at the destination; prefill and decode "
                         "must run the same model, dtype and block size")
    b = src.block_bytes
    if src.block_stride == b and dst.block_stride == b:
        rr = runs(src_blocks, dst_blocks)
    else:  # a shard's blocks lie a whole block apart: one row per block
        if len(src_blocks) != len(dst_blocks):
            raise ValueError(f"{len(src_blocks)} source blocks for {len(dst_blocks)} destination blocks")
        rr = [(s, d, 1) for s, d in zip(src_blocks, dst_blocks)]
    s_rows = [(sb + s * src.block_stride, n * b, src.device_id) for sb in src.bases for s, _, n in rr]
    d_rows = [(db + d * dst.block_stride, n * b, dst.device_id) for db in dst.bases for _, d, n in rr]
    return np.array(s_rows, dtype=np.int64).reshape(-1, 3), np.array(d_rows, dtype=np.int64).reshape(-1, 3)


def copy_blocks(src: BlockRegions, src_blocks: list[int], dst: BlockRegions, dst_blocks: list[int]) -> None:
    """Copy blocks between two mapped layouts (pool -> KV cache on the decode engine), run by
    run; asynchronous on a GPU (``non_blocking``), so the caller synchronises."""
    assert src.views is not None and dst.views is not None
    for s, d, n in runs(src_blocks, dst_blocks):
        for sv, dv in zip(src.views, dst.views):
            dv[d:d + n].copy_(sv[s:s + n], non_blocking=True)


def pool_path(run_dir: Path, rank: int) -> Path:
    """Where decode rank ``rank`` of the run in ``run_dir`` keeps its pool: shared memory, on
    its own node."""
    tag = hashlib.blake2b(str(run_dir).encode(), digest_size=6).hexdigest()
    return Path("/dev/shm") / f"pd-pipeline-{os.getuid()}-{tag}-decode{rank}.kv"


class DramPool:
    """The decode role process's side of the tier: the shared-memory file, its NIXL registration,
    a slot allocator that counts KV blocks (not requests), and completion notifications.

    ``nbytes`` is rounded down to whole slots of ``slot_bytes`` (one KV block, all layers, every
    KV head). ``writers``: the completion notifications a request's KV arrives with, one per
    rank of the prefill engines (``model.prefill_tp``: each rank writes its own KV heads).

    Raises:
        ValueError: the pool holds no slot at all.
    """

    def __init__(self, path: Path, nbytes: int, slot_bytes: int, agent_name: str, progress_delay_us: int,
                 writers: int = 1):
        import torch
        from nixl._api import nixl_agent, nixl_agent_config

        from pipeline.engine.nixl_agent import with_progress_delay

        self.path, self.slot_bytes = Path(path), slot_bytes
        self.num_slots = nbytes // slot_bytes
        if self.num_slots < 1:
            raise ValueError(f"offload.dram_gib gives {nbytes} bytes, less than one KV block ({slot_bytes} bytes)")
        size = self.num_slots * slot_bytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        self.tensor = torch.from_file(str(self.path), shared=True, size=size, dtype=torch.uint8)
        self.base = self.tensor.data_ptr()
        with with_progress_delay(progress_delay_us):
            self.agent = nixl_agent(agent_name, nixl_agent_config(backends=["UCX"]))
        self.agent_name = agent_name
        self._reg = self.agent.register_memory([(self.base, size, 0, "")], "DRAM")
        self.metadata = base64.b64encode(self.agent.get_agent_metadata()).decode()
        self.free_slots: list[int] = list(range(self.num_slots))
        # The tier's use over the run: (time.time(), slots in use) after every change while there
        # are fewer than MAX_USE_POINTS of them, then after every 2nd, 4th, ... (the list halved
        # each time it fills), so a run of millions of rows keeps a bounded timeline; the peak
        # and the latest point are exact.
        self.use: list[tuple[float, int]] = [(time.time(), 0)]
        self.peak_slots, self._changes, self._stride, self._latest = 0, 0, 1, self.use[0]
        self._freed = asyncio.Condition()
        self.writers = writers
        self._arrived: dict[str, asyncio.Event] = {}
        self._notified: dict[str, int] = {}  # request id -> notifications so far, until all writers'
        self._early: set[str] = set()  # requests whose KV arrived whole before anyone waited

    def describe(self) -> dict:
        """What a prefill worker needs to write into this pool (goes in ``kv_transfer_params``)."""
        return {"agent": self.agent_name, "metadata": self.metadata, "base": self.base,
                "num_slots": self.num_slots, "slot_bytes": self.slot_bytes}

    def forget(self, request_id: str) -> None:
        """Drop any notification of ``request_id`` seen so far: called as its slots are reserved,
        so that a request id a requeued prefill worker uses again never counts writes of the
        attempt before (with a TP-n prefill engine, a dead attempt's first k of n writes would
        otherwise let the next attempt's load start after only n - k of its own)."""
        self._notified.pop(request_id, None)
        self._early.discard(request_id)

    async def allocate(self, blocks: int, timeout_s: float) -> list[int]:
        """``blocks`` slots, waiting until that many are free; lowest slot numbers first, so a
        request tends to get one consecutive run.

        Raises:
            PoolFull: ``blocks`` exceeds the whole pool.
            TimeoutError: not enough slots came free within ``timeout_s`` seconds.
        """
        if blocks > self.num_slots:
            raise PoolFull(f"the request needs {blocks} KV blocks in the DRAM tier, which holds "
                           f"{self.num_slots}; raise offload.dram_gib")
        async with self._freed:
            await asyncio.wait_for(self._freed.wait_for(lambda: len(self.free_slots) >= blocks), timeout_s)
            self.free_slots.sort()
            slots, self.free_slots = self.free_slots[:blocks], self.free_slots[blocks:]
            self._record_use()
            return slots

    async def release(self, slots: list[int]) -> None:
        async with self._freed:
            self.free_slots.extend(slots)
            self._record_use()
            self._freed.notify_all()

    MAX_USE_POINTS = 10_000

    def _record_use(self) -> None:
        used = self.num_slots - len(self.free_slots)
        self.peak_slots = max(self.peak_slots, used)
        self._latest = (time.time(), used)
        self._changes += 1
        if self._changes % self._stride == 0:
            self.use.append(self._latest)
            if len(self.use) > self.MAX_USE_POINTS:
                self.use, self._stride = self.use[::2], self._stride * 2

    def use_record(self) -> dict:
        """The tier's use over the run, for ``RUN_DIR/metrics/dram/`` (:func:`pipeline.io.metrics.write_dram_use`):
        ``num_slots`` and ``slot_bytes`` (one KV block of all layers, bytes), ``peak_slots`` (the
        most slots ever in use at once), and ``use``: ``[time.time(), slots in use]`` after every
        reservation and release (every ``2^k``-th one past :attr:`MAX_USE_POINTS` changes; the
        first and the latest always)."""
        points = self.use if self.use[-1] is self._latest else [*self.use, self._latest]
        return {"num_slots": self.num_slots, "slot_bytes": self.slot_bytes, "peak_slots": self.peak_slots,
                "use": [list(u) for u in points]}

    async def arrived(self, request_id: str, timeout_s: float) -> None:
        """Wait for the prefill worker's notifications (one per rank of its engine) that
        ``request_id``'s KV is in the pool.

        Raises:
            TimeoutError: none within ``timeout_s`` seconds."""
        if request_id in self._early:
            self._early.discard(request_id)
            return
        ev = self._arrived.setdefault(request_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        finally:
            self._arrived.pop(request_id, None)

    async def poll_notifications(self, every_s: float = 0.002) -> None:
        """Run forever: hand NIXL completion notifications (the request id, sent by the prefill
        worker with its WRITE) to :meth:`arrived`: every ``every_s`` seconds while someone
        waits, every 50 ms otherwise."""
        while True:
            await asyncio.sleep(every_s if self._arrived else 0.05)
            for msgs in self.agent.get_new_notifs().values():
                for m in msgs:
                    rid = m.decode()
                    seen = self._notified.get(rid, 0) + 1
                    if seen < self.writers:
                        self._notified[rid] = seen
                        continue
                    self._notified.pop(rid, None)
                    ev = self._arrived.get(rid)
                    if ev is not None:
                        ev.set()
                    else:
                        self._early.add(rid)

    def close(self) -> None:
        try:
            self.agent.deregister_memory(self._reg)
        except Exception:  # noqa: BLE001 (shutting down)
            pass
        self.path.unlink(missing_ok=True)

