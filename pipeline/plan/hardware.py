"""The machine a worker runs on: :class:`Hardware` and its presets."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.plan.units import GB, GIB, TIB


@dataclass(frozen=True)
class Hardware:
    """One device of a worker (a worker of tensor-parallel size ``tp`` has ``tp`` of them).

    Units: ``peak_flops`` FLOP/s (dense bf16), ``mem_bw`` bytes/s, ``memory_bytes`` bytes,
    ``link_bw`` bytes/s between a prefill and a decode device (NIXL over RDMA / shared memory).
    ``mfu`` and ``mbu`` are the fractions of peak compute and memory bandwidth reached (prefill,
    decode). ``mem_fraction`` is vLLM's ``gpu_memory_utilization``; ``kv_cache_bytes`` when set
    is a fixed KV cache per worker (vLLM CPU: ``VLLM_CPU_KVCACHE_SPACE``) instead of memory left
    after the weights. ``max_batch`` is vLLM's ``max_num_seqs`` (128: the scheduler default for
    the ``AsyncLLM`` engines the pipeline starts, vLLM 0.32). ``handoff_s`` is the seconds a KV
    hand-off takes beyond moving its bytes (messages, decode scheduling, waiting for the prefill
    engine's step boundary): 0 in the presets, fitted by :func:`~pipeline.plan.calibrate.calibrate`.

    The decode host-DRAM tier (:func:`pipeline.plan.dram.dram_tier`) also uses: ``h2d_bw``,
    bytes/s from host DRAM into one device's memory (each of a worker's ``tp`` devices loads its
    share of the KV heads over its own link); ``node_devices``, devices per node;
    ``node_dram_bytes``, host DRAM of one node in bytes (``None``: this machine's, from
    ``/proc/meminfo``).
    """

    name: str
    peak_flops: float
    mem_bw: float
    memory_bytes: float
    link_bw: float
    mfu: float = 0.5
    mbu: float = 0.7
    mem_fraction: float = 0.9
    kv_cache_bytes: float | None = None
    max_batch: int = 128
    h2d_bw: float = 55 * GB
    node_devices: int = 8
    node_dram_bytes: float | None = None
    handoff_s: float = 0.0

    @property
    def ranks_share_cores(self) -> bool:
        """A CPU profile (a fixed KV space, vLLM's CPU backend): a worker's TP ranks run on the
        worker's own cores, so its TP size adds no compute and no bandwidth. Measured on the
        2-core machine: a pool at TP 3, its ranks on one core, ran at 0.38x (prefill) and 0.24x
        (decode) the output tokens/s of TP 1 (BENCHMARKS.md, "Each pool its own TP")."""
        return self.kv_cache_bytes is not None


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, 80 GB; one 400 Gb/s
    # InfiniBand NIC per GPU = 50 GB/s. Host side (assumptions, for the DRAM tier): 8 GPUs and
    # 2 TiB of DRAM per node (DGX H100 / H200: "2 TB" of system memory, 32 x 64 GiB DIMMs);
    # host-to-device 55 GB/s per GPU, the effective rate of PCIe Gen5 x16 (64 GB/s raw per
    # direction: 32 GT/s x 16 lanes x 128/130).
    "h100": Hardware("h100", peak_flops=989e12, mem_bw=3.35e12, memory_bytes=80 * GB, link_bw=50 * GB,
                     h2d_bw=55 * GB, node_devices=8, node_dram_bytes=2 * TIB),
    # NVIDIA H200: same compute, 4.8 TB/s HBM3e, 141 GB; the same PCIe Gen5 x16 host link and node.
    "h200": Hardware("h200", peak_flops=989e12, mem_bw=4.8e12, memory_bytes=141 * GB, link_bw=50 * GB,
                     h2d_bw=55 * GB, node_devices=8, node_dram_bytes=2 * TIB),
    # One worker's share of the 2-core test machine (the local launcher gives each worker one
    # core). Order of magnitude only, near what `calibrate` fitted on a 1P:1D SmolLM2 run here
    # (prefill ~8e10 FLOP/s; decode ~2.6e9 bytes/s effective, per-step overheads included;
    # hand-offs ~6e7 bytes/s effective). KV space: model.kv_cache_gib (1 GiB by default).
    # DRAM tier: the "KV cache" is DRAM too, so a load is a memcpy (9-11 GB/s single-threaded for
    # 256 MiB here, BENCHMARKS.md); a node is this 2-core machine (two workers), its DRAM read
    # from /proc/meminfo.
    "cpu": Hardware("cpu", peak_flops=1.6e11, mem_bw=1e10, memory_bytes=8 * GIB, link_bw=1e8,
                    mfu=0.5, mbu=0.25, mem_fraction=1.0, kv_cache_bytes=1 * GIB,
                    h2d_bw=1e10, node_devices=2, node_dram_bytes=None),
}


def hardware(name: str) -> Hardware:
    """The preset called ``name`` (``h100``, ``h200``, ``cpu``).

    Raises:
        ValueError: no such preset.
    """
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; presets: {', '.join(HARDWARE)}")
    return HARDWARE[name]
