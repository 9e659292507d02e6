"""What Slurm's queue says about a run's jobs (:class:`_QueueCheck`), and the word the launcher
says about jobs Slurm holds (:func:`warn_held`); used by :mod:`pipeline.launch.watch`."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from tqdm import tqdm


class _QueueCheck:
    """What Slurm's queue says about submitit jobs, which submitit alone cannot tell without Slurm
    accounting:

    - a job that left the queue without writing a result (cancelled, killed for memory, node
      failure) has ended: absent from two ``squeue`` answers in a row;
    - a job that wrote a result but is back in the queue (requeued after preemption, a time
      limit or ``scontrol requeue``) has not ended: its next attempt will write the result again.

    ``squeue`` is asked at most every ``every_s`` seconds, and every ``soon_s`` seconds while a
    listed job has just written its result (submitit writes it just before the job exits, so
    the job is about to leave the queue; asking only every ``every_s`` put every Slurm run's end
    up to 10 s late, twice: array tasks, then decode ranks). Only for ``soon_for_s`` seconds per
    result written: a requeued job with its earlier attempt's result on disk is not asked about
    every second for the hours it may wait or run. ``pending`` holds the listed jobs
    waiting for nodes (a requeued one included), ``held`` those of them Slurm will not start
    until someone releases them, with squeue's reason (``JobHeldUser``, ``JobHeldAdmin``, and
    ``launch failed requeued held``: a requeued job whose start failed on its node).
    """

    def __init__(self, every_s: float = 10.0, soon_s: float = 1.0, soon_for_s: float = 30.0):
        self.every_s, self.soon_s, self.soon_for_s, self.last = every_s, soon_s, soon_for_s, -1e9
        self.looked = -1e9  # when the result files were last looked at
        self.written: dict[str, tuple[float, float]] = {}  # job id -> (its result's mtime, when first seen)
        self.listed: set[str] = set()
        self.pending: set[str] = set()
        self.held: dict[str, str] = {}
        self.absent: set[str] = set()
        self.gone: set[str] = set()

    def refresh(self, jobs: list) -> None:
        slurm = [j for j in jobs if type(j).__name__ == "SlurmJob"]
        since = time.monotonic() - self.last
        if not slurm or (since < self.every_s and (since < self.soon_s or not self._ending(slurm))):
            return
        self.last = time.monotonic()
        try:
            out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T %r", "-j", ",".join(j.job_id for j in slurm)],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return
        # squeue fails with "Invalid job id" once every listed job has been purged.
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            return
        rows = [line.split(maxsplit=2) for line in out.stdout.splitlines() if line.strip()]
        self.listed = {r[0] for r in rows}
        self.pending = {r[0] for r in rows if len(r) > 1 and r[1] == "PENDING"}
        self.held = {r[0]: r[2] for r in rows if len(r) > 2 and r[1] == "PENDING" and "held" in r[2].lower()}
        absent = {j.job_id for j in slurm if j.job_id not in self.listed}
        self.gone |= absent & self.absent
        self.absent = absent

    def _ending(self, slurm: list) -> bool:
        """Whether a listed job wrote its result (a result file new since last looked at, looked
        at once every ``soon_s`` at most: a large array on a shared file system) less than
        ``soon_for_s`` seconds ago."""
        now = time.monotonic()
        if now - self.looked >= self.soon_s:
            self.looked = now
            for j in slurm:
                if j.job_id in self.listed:
                    try:
                        mtime = j.paths.result_pickle.stat().st_mtime
                    except OSError:
                        continue
                    if self.written.get(j.job_id, (None,))[0] != mtime:
                        self.written[j.job_id] = (mtime, now)
        return any(now - seen < self.soon_for_s for i, (_, seen) in self.written.items() if i in self.listed)

    def ended(self, job) -> bool:
        if type(job).__name__ != "SlurmJob":
            return job.done()
        if job.job_id in self.listed:
            return False
        return job.done() or job.job_id in self.gone


def warn_held(jobs: Any, queue: _QueueCheck, warned: dict[str, str]) -> None:
    """Say once per job and reason when Slurm holds one of the run's jobs (:attr:`_QueueCheck.held`),
    and when it is released: a held job never starts by itself, so without a word the run would
    seem to hang (an array task's rows wait for it) or to have lost a decode rank for good.
    ``warned``: job id -> the hold last reported."""
    names = {j.job_id: f"array task {i}" for i, j in enumerate(jobs.array_tasks)}
    names.update({j.job_id: f"decode rank {r}" for r, j in enumerate(jobs.decode)})
    for job_id, reason in queue.held.items():
        if job_id in names and warned.get(job_id) != reason:
            warned[job_id] = reason
            waits = ("the run waits for its rows" if names[job_id].startswith("array")
                     else "the other decode ranks serve its rows meanwhile")
            tqdm.write(f"warning: job {job_id} ({names[job_id]}) is held by Slurm ({reason}) and will not start "
                       f"until it is released: `scontrol release {job_id}` (a hold an administrator set needs "
                       f"them); {waits}", file=sys.stderr)
    for job_id in [j for j in warned if j not in queue.held]:
        del warned[job_id]
        if job_id in queue.listed:
            tqdm.write(f"job {job_id} ({names.get(job_id, 'of this run')}) was released", file=sys.stderr)
