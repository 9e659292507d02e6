"""Local launcher: every worker is a process on this machine, started by submitit's
``LocalExecutor`` (the same job functions the Slurm launcher submits)."""

from __future__ import annotations

import os
import socket

import submitit

from pipeline.config import Config
from pipeline.launch.rundir import RunDir
from pipeline.launch.watch import Jobs
from pipeline.roles.colocated import colocated_main
from pipeline.roles.decode import decode_main
from pipeline.roles.prefill import prefill_main


def cpu_slices(n_workers: int, cpu_bind: str) -> list[str | None]:
    """Core lists for ``VLLM_CPU_OMP_THREADS_BIND``, one per local worker.

    ``partition`` splits this process's cores into ``n_workers`` contiguous slices (a worker
    shares a core only when there are more workers than cores); ``auto`` gives None (vLLM picks).
    Two engines unpinned on the same cores fight over them: 8 prompts took ~25 s to decode
    unpinned against 1.3 s pinned on this 2-core machine kind (shared/DESIGN.md).
    """
    if cpu_bind == "auto":
        return [None] * n_workers
    cores = sorted(os.sched_getaffinity(0))
    if n_workers >= len(cores):
        return [str(cores[i % len(cores)]) for i in range(n_workers)]
    per, extra = divmod(len(cores), n_workers)
    out, start = [], 0
    for i in range(n_workers):
        n = per + (1 if i < extra else 0)
        out.append(",".join(str(c) for c in cores[start:start + n]))
        start += n
    return out


def free_ports(n: int, host: str) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (for NIXL side channels)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch_local(cfg: Config, run: RunDir) -> Jobs:
    """Start the workers of ``cfg.pools`` as local processes; returns their submitit jobs."""
    ex = submitit.LocalExecutor(folder=str(run.logs / "%j"))
    ex.update_parameters(timeout_min=cfg.cluster.timeout_min)
    p, d, path = cfg.pools.prefill, cfg.pools.decode, str(run.path)
    if cfg.pools.mode == "colocated":
        cpus = cpu_slices(p, cfg.cluster.cpu_bind)
        owners = [ex.submit(colocated_main, path, i, p, cpus[i]) for i in range(p)]
        return Jobs(owners=owners, servers=[])
    cpus = cpu_slices(p + d, cfg.cluster.cpu_bind)
    if cfg.transport.base_port:
        ports = [cfg.transport.base_port + 10 * i for i in range(p + d)]
    else:
        ports = free_ports(p + d, cfg.transport.host)
    servers = [ex.submit(decode_main, path, r, cpus[p + r], ports[p + r]) for r in range(d)]
    owners = [ex.submit(prefill_main, path, i, p, cpus[i], ports[i]) for i in range(p)]
    return Jobs(owners=owners, servers=servers)
