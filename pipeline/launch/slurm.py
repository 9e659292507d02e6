"""Slurm launcher (submitit): the decode ranks as one job per node (a node lost takes only its
own ranks), one task per rank; the prefill (or colocated) workers as a job array whose
parallelism is the prefill pool size, each task claiming shards as it frees up (at most
``cluster.shards_per_task`` each, when set), held until the decode jobs have started
(``--dependency=after:JOBID:JOBID...``) so prefill never holds nodes while decode waits in the
queue. Arrays larger than the cluster's ``MaxArraySize`` are split into chunks, each held until
the previous chunk ends, so at most ``pools.prefill`` tasks run at once."""

from __future__ import annotations

import math
import re
import subprocess

import submitit

from pipeline.config import Config
from pipeline.engine.env import worker_cpus
from pipeline.launch.jobs import ArrayTaskJob, DecodeJob
from pipeline.runtime.rundir import RunDir
from pipeline.launch.watch import Jobs


def max_array_size() -> int:
    """Array tasks one job may have: the cluster's ``MaxArraySize`` (its highest index is one
    less). 1001 (Slurm's default) when ``scontrol`` does not say."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1001
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.M)
    return int(m.group(1)) if m else 1001


def n_array_tasks(cfg: Config, n_units: int) -> int:
    """Array tasks over ``n_units`` work units (shards, or parts of big ones): enough for each
    to claim at most ``cluster.shards_per_task`` units (so that each fits the cluster's time
    limit), or ``pools.prefill`` when that is unset; never more than there are units."""
    per = cfg.cluster.shards_per_task
    n = math.ceil(n_units / per) if per else cfg.pools.prefill
    return max(1, min(n, n_units))


def _executor(cfg: Config, run: RunDir, name: str, tp: int, partition: str | None) -> submitit.SlurmExecutor:
    """An executor with the cluster's sbatch options; a worker of TP size ``tp`` gets
    ``tp x cluster.gpus_per_task`` GPUs; ``partition`` (the pool's own) or ``cluster.partition``.
    Making one writes nothing (its log folder is made at submission)."""
    c = cfg.cluster
    ex = submitit.SlurmExecutor(folder=str(run.logs / "%j"))
    params = dict(job_name=name, time=c.timeout_min, partition=partition or c.partition, account=c.account,
                  qos=c.qos, constraint=c.constraint, cpus_per_task=c.cpus_per_task,
                  gpus_per_task=c.gpus_per_task * tp or None,
                  mem=f"{int(c.mem_gb * 1024)}M" if c.mem_gb else None,
                  exclusive=c.exclusive or None, setup=list(c.setup) or None,
                  additional_parameters={"requeue": True, **dict(c.additional_parameters)})
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


def _decode_executors(cfg: Config, run: RunDir) -> list[tuple[int, submitit.SlurmExecutor]]:
    """One executor per decode job: ``[(its first rank, executor)]``, ``cluster.decode_ranks_per_node``
    ranks a node (one task each), the last job taking what is left."""
    d = cfg.pools.decode
    per_node = min(cfg.cluster.decode_ranks_per_node, d)
    out = []
    for first in range(0, d, per_node):
        ex = _executor(cfg, run, f"pd-decode-{run.path.name}", cfg.model.decode_tp, cfg.cluster.decode_partition)
        ex.update_parameters(nodes=1, ntasks_per_node=min(per_node, d - first))
        out.append((first, ex))
    return out


def launch_slurm(cfg: Config, run: RunDir, n_units: int) -> Jobs:
    """Submit the run's jobs; returns them without waiting."""
    path = str(run.path)
    decode_jobs = []
    depends = None
    if cfg.pools.mode == "disaggregated":
        for first, ex in _decode_executors(cfg, run):
            decode_jobs.append(ex.submit(DecodeJob(path, first), None, worker_cpus(cfg.cluster.decode_cpus, first)))
        depends = "after:" + ":".join(j.job_id for j in decode_jobs)
    role = "prefill" if cfg.pools.mode == "disaggregated" else "colocated"
    n_tasks = n_array_tasks(cfg, n_units)
    task_job = ArrayTaskJob(role, path, cfg.cluster.shards_per_task)
    chunk = cfg.cluster.max_array_size or max_array_size()
    tasks_jobs: list = []
    for start in range(0, n_tasks, chunk):
        ex = _task_executor(cfg, run)
        extra = dict(ex.parameters.get("additional_parameters") or {})
        deps = [d for d in (depends, f"afterany:{tasks_jobs[-1].job_id.split('_')[0]}" if tasks_jobs else None) if d]
        if deps:
            extra["dependency"] = ",".join(deps)
        ex.update_parameters(array_parallelism=cfg.pools.prefill, additional_parameters=extra)
        tasks = list(range(start, min(start + chunk, n_tasks)))
        tasks_jobs += ex.map_array(task_job, tasks, [worker_cpus(cfg.cluster.prefill_cpus, i) for i in tasks])
    return Jobs(array_tasks=tasks_jobs, decode=decode_jobs, restart=_task_restart(cfg, run, task_job))


def sbatch_preview(cfg: Config, run: RunDir, n_units: int) -> list[tuple[str, list[str]]]:
    """What :func:`launch_slurm` would submit, for ``--dry-run``: ``[(job, its #SBATCH lines)]``,
    one per decode job and one per prefill (or colocated) array chunk, as submitit writes them
    (``submitit.slurm.slurm._make_sbatch_string`` on the executors :func:`launch_slurm` makes);
    job ids not known yet read ``JOBID``. Writes nothing and asks nothing of Slurm except
    ``MaxArraySize`` when ``cluster.max_array_size`` is null."""
    from submitit.slurm.slurm import _make_sbatch_string

    def lines(ex: submitit.SlurmExecutor, **more) -> list[str]:
        text = _make_sbatch_string(command="true", folder=ex.folder, **{**ex.parameters, **more})
        return [line for line in text.splitlines() if line.startswith("#SBATCH")]

    out = []
    decode_ids = []
    if cfg.pools.mode == "disaggregated":
        for first, ex in _decode_executors(cfg, run):
            decode_ids.append("JOBID")
            out.append((f"decode ranks {first}-{first + ex.parameters['ntasks_per_node'] - 1}", lines(ex)))
    role = "prefill" if cfg.pools.mode == "disaggregated" else "colocated"
    n_tasks = n_array_tasks(cfg, n_units)
    chunk = cfg.cluster.max_array_size or max_array_size()
    for start in range(0, n_tasks, chunk):
        ex = _task_executor(cfg, run)
        extra = dict(ex.parameters.get("additional_parameters") or {})
        deps = [d for d in ("after:" + ":".join(decode_ids) if decode_ids else None,
                            "afterany:JOBID" if start else None) if d]
        if deps:
            extra["dependency"] = ",".join(deps)
        ex.update_parameters(array_parallelism=cfg.pools.prefill, additional_parameters=extra)
        end = min(start + chunk, n_tasks)
        out.append((f"{role} array tasks {start}-{end - 1}",
                    lines(ex, map_count=end - start)))
    return out


def _task_executor(cfg: Config, run: RunDir) -> submitit.SlurmExecutor:
    """The executor of the prefill (or colocated) array: one task, one node."""
    role = "prefill" if cfg.pools.mode == "disaggregated" else "colocated"
    ex = _executor(cfg, run, f"pd-{role}-{run.path.name}", cfg.model.prefill_tp, cfg.cluster.prefill_partition)
    ex.update_parameters(nodes=1, ntasks_per_node=1)
    return ex


def _task_restart(cfg: Config, run: RunDir, task_job: ArrayTaskJob):
    """restart(i): array task ``i`` submitted again as a job of its own (same task index)."""
    return lambda i: _task_executor(cfg, run).submit(task_job, i, worker_cpus(cfg.cluster.prefill_cpus, i))


def join_slurm(cfg: Config, run: RunDir, tasks: list[int]) -> Jobs:
    """Submit array tasks ``tasks`` (indices beyond those of the run's launch) as a job array
    that joins the running run at ``run``: no dependency, all at once."""
    role = "prefill" if cfg.pools.mode == "disaggregated" else "colocated"
    task_job = ArrayTaskJob(role, str(run.path), cfg.cluster.shards_per_task)
    ex = _task_executor(cfg, run)
    ex.update_parameters(array_parallelism=len(tasks))
    jobs = ex.map_array(task_job, tasks, [worker_cpus(cfg.cluster.prefill_cpus, i) for i in tasks])
    restart = _task_restart(cfg, run, task_job)
    return Jobs(array_tasks=jobs, restart=lambda k: restart(tasks[k]))
