"""Follow a launched run: progress bars from the run directory, failures from the jobs, and the
orderly shutdown of decode workers once every shard owner has ended."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from pipeline.launch.rundir import RunDir


class RunFailed(RuntimeError):
    """One or more workers failed; the message names them and their logs."""


@dataclass
class Jobs:
    """submitit jobs of one run: ``owners`` own shards (prefill or colocated workers), ``servers``
    are decode workers."""

    owners: list = field(default_factory=list)
    servers: list = field(default_factory=list)

    def all(self) -> list:
        return self.owners + self.servers


class _QueueCheck:
    """Finds Slurm jobs that left the queue without writing a result (cancelled, killed for
    memory, node failure). Without Slurm accounting, submitit cannot tell such a job from a running
    one and would wait for its result forever. Asks ``squeue`` at most every ``every_s`` seconds;
    a job is gone after being absent from two answers in a row."""

    def __init__(self, every_s: float = 15.0):
        self.every_s, self.last, self.absent = every_s, 0.0, set()
        self.gone: set[str] = set()

    def __call__(self, jobs: list) -> set[str]:
        slurm = [j for j in jobs if type(j).__name__ == "SlurmJob" and not j.done()]
        if not slurm or time.monotonic() - self.last < self.every_s:
            return self.gone
        self.last = time.monotonic()
        try:
            out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(j.job_id for j in slurm)],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return self.gone
        listed = set(out.stdout.split())
        # squeue fails with "Invalid job id" once every listed job has been purged.
        known = out.returncode == 0 or "Invalid job id" in out.stderr
        absent = {j.job_id for j in slurm if j.job_id not in listed} if known else set()
        self.gone |= {j for j in absent & self.absent if not _job(jobs, j).done()}
        self.absent = absent
        return self.gone


def _job(jobs: list, job_id: str):
    return next(j for j in jobs if j.job_id == job_id)


def _ended(job, gone: set[str]) -> bool:
    return job.done() or job.job_id in gone


def _failure(job, gone: set[str] = frozenset()) -> str | None:
    """One line saying why ``job`` failed, or None if it succeeded or still runs."""
    if job.job_id in gone and not job.done():
        return f"job {job.job_id} left the queue without a result (cancelled, out of memory or node failure?); log: {job.paths.stderr}"
    if not job.done():
        return None
    try:
        exc = job.exception()
    except Exception as uncompleted:  # killed before writing any result (kill -9, OOM)
        exc = uncompleted
    if exc is None:
        return None
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    # submitit's FailedJobError text ends with the worker's own traceback; its last line is the cause.
    cause = lines[-1] if lines else type(exc).__name__
    return f"job {job.job_id}: {cause} (log: {job.paths.stderr})"


def watch(run: RunDir, jobs: Jobs, total_rows: int, progress: bool = True,
          poll_s: float = 0.5, stop_grace_s: float = 120.0) -> None:
    """Wait for every owner to end, showing rows and output tokens done; then ask decode workers
    to stop and wait for them.

    Raises:
        RunFailed: a worker failed, or a decode worker ended while owners still needed it.
    """
    rows_bar = tqdm(total=total_rows, unit="row", desc="rows", disable=not progress, dynamic_ncols=True)
    tokens_bar = tqdm(unit="tok", desc="output tokens", disable=not progress, dynamic_ncols=True)
    errors: list[str] = []
    gone = _QueueCheck()
    try:
        while not all(_ended(j, gone(jobs.all())) for j in jobs.owners):
            done = run.progress()
            rows_bar.update(sum(p["rows"] for p in done) - rows_bar.n)
            tokens_bar.update(sum(p["output_tokens"] for p in done) - tokens_bar.n)
            dead = [j for j in jobs.servers if _ended(j, gone.gone)]
            if dead:
                errors += [_failure(j, gone.gone) or f"decode job {j.job_id} ended early (log: {j.paths.stderr})" for j in dead]
                for j in jobs.owners:
                    j.cancel(check=False)
                break
            time.sleep(poll_s)
        done = run.progress()
        rows_bar.update(sum(p["rows"] for p in done) - rows_bar.n)
        tokens_bar.update(sum(p["output_tokens"] for p in done) - tokens_bar.n)
    except KeyboardInterrupt:
        for j in jobs.all():
            j.cancel(check=False)
        raise
    finally:
        rows_bar.close()
        tokens_bar.close()
        run.request_stop()
    deadline = time.monotonic() + stop_grace_s
    while not all(_ended(j, gone(jobs.servers)) for j in jobs.servers) and time.monotonic() < deadline:
        time.sleep(poll_s)
    for j in jobs.servers:
        if not j.done():
            j.cancel(check=False)
    errors += [e for e in (_failure(j, gone.gone) for j in jobs.owners) if e]
    if errors:
        raise RunFailed("; ".join(dict.fromkeys(errors)))
