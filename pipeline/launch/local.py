"""Local launcher: every worker is a process on this machine, started by submitit's
``LocalExecutor`` (the same job functions the Slurm launcher submits)."""

from __future__ import annotations

import os

import submitit

from pipeline.config import Config
from pipeline.runtime.rundir import RunDir
from pipeline.launch.jobs import ArrayTaskJob, DecodeJob
from pipeline.launch.watch import Jobs


def cpu_slices(n_workers: int, cpu_bind: str) -> list[str | None]:
    """Core lists for ``VLLM_CPU_OMP_THREADS_BIND``, one per local worker.

    ``partition`` splits this process's cores into ``n_workers`` contiguous slices (a worker
    shares a core only when there are more workers than cores); ``auto`` gives None (vLLM picks).
    Two engines unpinned on the same cores fight over them: 8 prompts took ~25 s to decode
    unpinned against 1.3 s pinned on this 2-core machine kind (measured when the project started).
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


def launch_local(cfg: Config, run: RunDir) -> Jobs:
    """Start the workers of ``cfg.pools`` as local processes; returns their submitit jobs."""
    ex = submitit.LocalExecutor(folder=str(run.logs / "%j"))
    ex.update_parameters(timeout_min=cfg.cluster.timeout_min)
    p, d, path = cfg.pools.prefill, cfg.pools.decode, str(run.path)
    if cfg.pools.mode == "colocated":
        cpus = cpu_slices(p, cfg.cluster.cpu_bind)
        colocated = ArrayTaskJob("colocated", path)
        return Jobs(array_tasks=[ex.submit(colocated, i, cfg.cluster.prefill_cpus or cpus[i]) for i in range(p)])
    cpus = cpu_slices(p + d, cfg.cluster.cpu_bind)
    decode, prefill = DecodeJob(path), ArrayTaskJob("prefill", path)
    decode_jobs = [ex.submit(decode, r, cfg.cluster.decode_cpus or cpus[p + r]) for r in range(d)]
    prefill_jobs = [ex.submit(prefill, i, cfg.cluster.prefill_cpus or cpus[i]) for i in range(p)]
    return Jobs(array_tasks=prefill_jobs, decode=decode_jobs)
