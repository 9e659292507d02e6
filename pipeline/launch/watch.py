"""Follow a launched run: progress bars from the run directory, failures from the jobs, and the
orderly shutdown of decode workers once every shard owner has ended."""

from __future__ import annotations

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


def _failure(job) -> str | None:
    """One line saying why ``job`` failed, or None if it succeeded or still runs."""
    if not job.done():
        return None
    exc = job.exception()
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
    try:
        while not all(j.done() for j in jobs.owners):
            done = run.progress()
            rows_bar.update(sum(p["rows"] for p in done) - rows_bar.n)
            tokens_bar.update(sum(p["output_tokens"] for p in done) - tokens_bar.n)
            dead = [j for j in jobs.servers if j.done()]
            if dead:
                errors += [_failure(j) or f"decode job {j.job_id} ended early (log: {j.paths.stderr})" for j in dead]
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
    while not all(j.done() for j in jobs.servers) and time.monotonic() < deadline:
        time.sleep(poll_s)
    for j in jobs.servers:
        if not j.done():
            j.cancel(check=False)
    errors += [e for e in (_failure(j) for j in jobs.owners) if e]
    if errors:
        raise RunFailed("; ".join(dict.fromkeys(errors)))
