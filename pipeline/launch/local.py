"""Local launcher: every worker is a process on this machine, started by submitit's
``LocalExecutor`` (the same job functions the Slurm launcher submits)."""

from __future__ import annotations

import os
from typing import Any, Callable

import submitit

from pipeline.config import Config
from pipeline.engine.env import deal_cores, worker_cpus
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
    return deal_cores(sorted(os.sched_getaffinity(0)), n_workers)


def _executor(cfg: Config, run: RunDir):
    ex = submitit.LocalExecutor(folder=str(run.logs / "%j"))
    ex.update_parameters(timeout_min=cfg.cluster.timeout_min)
    return ex


def _cores(cfg: Config) -> list[str | None]:
    """Each local worker's cores: prefill (or colocated) workers first, then decode ranks."""
    d = 0 if cfg.pools.mode == "colocated" else cfg.pools.decode
    return cpu_slices(cfg.pools.prefill + d, cfg.cluster.cpu_bind)


def _task_starter(cfg: Config, run: RunDir, ex) -> Callable[[int], Any]:
    """start(i): array task ``i`` as a local process, on the cores of prefill worker
    ``i mod pools.prefill`` (a task that joined later shares them)."""
    role = "colocated" if cfg.pools.mode == "colocated" else "prefill"
    task_job, cpus, p = ArrayTaskJob(role, str(run.path)), _cores(cfg), cfg.pools.prefill
    return lambda i: ex.submit(task_job, i, worker_cpus(cfg.cluster.prefill_cpus, i) or cpus[i % p])


def launch_local(cfg: Config, run: RunDir) -> Jobs:
    """Start the workers of ``cfg.pools`` as local processes; returns their submitit jobs (with
    ``restart``: array task i started again on its own cores)."""
    ex = _executor(cfg, run)
    p, d = cfg.pools.prefill, cfg.pools.decode
    decode_jobs = []
    if cfg.pools.mode != "colocated":
        decode, cpus = DecodeJob(str(run.path)), _cores(cfg)
        decode_jobs = [ex.submit(decode, r, worker_cpus(cfg.cluster.decode_cpus, r) or cpus[p + r]) for r in range(d)]
    start = _task_starter(cfg, run, ex)
    return Jobs(array_tasks=[start(i) for i in range(p)], decode=decode_jobs, restart=start)


def join_local(cfg: Config, run: RunDir, tasks: list[int]) -> Jobs:
    """Start array tasks ``tasks`` (indices beyond those of the run's launch) as local processes
    that join the run at ``run``."""
    start = _task_starter(cfg, run, _executor(cfg, run))
    return Jobs(array_tasks=[start(i) for i in tasks], restart=lambda k: start(tasks[k]))
