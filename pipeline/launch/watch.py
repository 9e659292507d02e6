"""Follow a launched run: progress bars from the run directory, failures from the jobs, and the
orderly shutdown of decode workers once every shard owner has ended."""

from __future__ import annotations

import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tqdm import tqdm

from pipeline.io.atomic import write_json
from pipeline.launch.queue import _QueueCheck
from pipeline.launch.queue import warn_held as _warn_held
from pipeline.roles.work import TAKEOVER
from pipeline.runtime.claims import LiveWorkers, heartbeats
from pipeline.runtime.rundir import RunDir

# Times in a row an array task killed outright (no result, no exception) is started again with no
# row served by the run in between; a task whose restart was followed by served rows has its count
# reset, so a run of hours survives any number of faults that are each recovered from, while a task
# that dies at every start (an engine that cannot start on its node) does not loop.
TASK_RESTARTS = 2
LOST_RANK_GRACE_S = 30.0  # seconds decode jobs get to end once no rank serves, before they are cancelled


class RunFailed(RuntimeError):
    """One or more workers failed; the message names them and their logs."""


@dataclass
class Jobs:
    """submitit jobs of one run: ``array_tasks`` own the shards (prefill or colocated workers, the
    tasks of the job array on Slurm), ``decode`` are the decode ranks."""

    array_tasks: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    # restart(i): array task i started again (a new job, the same task index, so the same worker
    # id: it resumes its own claims); None where the launcher cannot.
    restart: Callable[[int], Any] | None = None

    def all(self) -> list:
        return self.array_tasks + self.decode

    def save(self, path) -> None:
        """Write the job ids to ``path`` (``RUN_DIR/jobs.json``), array tasks in task order."""
        write_json(path, {"array_tasks": [j.job_id for j in self.array_tasks],
                          "decode": [j.job_id for j in self.decode]})


# "pkg.mod.SomeError: message" (or "...Exception", "...Exit", "...Interrupt", and this project's
# DecodeUnavailable / DecodeLost), as Python prints an exception's last traceback line.
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Unavailable|Lost)\b")


def _failure(job, queue: _QueueCheck) -> str | None:
    """One line saying why ``job`` failed, or None if it succeeded or still runs."""
    if not queue.ended(job):
        return None
    if job.job_id in queue.gone and not job.done():
        return f"job {job.job_id} left the queue without a result (cancelled, out of memory or node failure?); log: {job.paths.stderr}"
    if not job.done():
        return None
    if not job.paths.result_pickle.exists():
        return f"job {job.job_id} ended without a result (killed?); log: {job.paths.stderr}"
    try:
        exc = job.exception()
    except Exception as uncompleted:  # killed before writing any result (kill -9, OOM)
        exc = uncompleted
    if exc is None:
        return None
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    # submitit's FailedJobError text holds the worker's traceback; its last "...Error: ..." line
    # is the cause. A KeyboardInterrupt is the launcher cancelling the job, not a cause, when
    # something else is named.
    causes = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    causes = [c for c in causes if not c.startswith("KeyboardInterrupt")] or causes
    cause = causes[-1] if causes else (lines[-1] if lines else type(exc).__name__)
    return f"job {job.job_id}: {cause} (log: {job.paths.stderr})"


class _DecodeBeats:
    """The decode ranks still serving, from their endpoint files (``RUN_DIR/decode/rank-N.json``):
    not marked ``stopped`` and a heartbeat that changed within ``dead_after_s`` seconds of this
    process's clock. A rank lost with its node is neither."""

    def __init__(self, run: RunDir, dead_after_s: float):
        self.run, self.dead_after_s = run, dead_after_s
        self.seen: dict[int, tuple[object, float]] = {}  # rank -> (heartbeat read, when it changed)
        self.lost: dict[int, str] = {}  # rank -> its worker, each rank once seen lost (even if requeued later)

    def serving(self) -> list[int]:
        now, out = time.monotonic(), []
        for rank, ep in self.run.decode_endpoints().items():
            beat = ep.get("heartbeat")
            if rank not in self.seen or self.seen[rank][0] != beat:
                self.seen[rank] = (beat, now)
            if ep.get("stopped"):
                continue
            if now - self.seen[rank][1] < self.dead_after_s:
                out.append(rank)
            elif rank not in self.lost:
                self.lost[rank] = ep["worker"]
                self.run.record_lost_decode(self.lost)
        return out


def _killed(job, queue: _QueueCheck) -> bool:
    """Whether ``job`` ended without a result or an exception of its own: killed outright
    (SIGKILL, the out-of-memory killer, its node lost and not requeued, cancelled)."""
    if not queue.ended(job):
        return False
    if job.job_id in queue.gone and not job.done():
        return True
    if not job.done():
        return False
    if not job.paths.result_pickle.exists():
        return True
    try:
        job.exception()
    except Exception:  # submitit's UncompletedJobError: no result written
        return True
    return False


@dataclass
class _Restarts:
    """Restarts of each array task: ``total`` so far, and ``in_a_row``, those with no row served
    by the run since the one before (rows done at the last restart: ``rows_at``)."""

    total: int = 0
    in_a_row: int = 0
    rows_at: int = -1


def _rows_done(run: RunDir) -> int:
    return sum(p["rows"] for p in run.progress())


def _restart_killed(run: RunDir, jobs: Jobs, queue: _QueueCheck, restarts: list[_Restarts]) -> None:
    """Start again each array task killed outright (:func:`_killed`) while some shard is neither
    done nor failed, unless it was started again :data:`TASK_RESTARTS` times in a row with no row
    served by the run in between; record the new job in ``RUN_DIR/jobs.json``."""
    if jobs.restart is None:
        return
    for i, job in enumerate(jobs.array_tasks):
        if not _killed(job, queue):
            continue
        r, rows = restarts[i], _rows_done(run)
        if rows > r.rows_at:
            r.in_a_row = 0
        if r.in_a_row >= TASK_RESTARTS:
            continue
        ended = set(run.done()) | set(run.failed())
        if all(s.name in ended for s in run.shards()):
            return
        why = _failure(job, queue)
        r.total, r.in_a_row, r.rows_at = r.total + 1, r.in_a_row + 1, rows
        jobs.array_tasks[i] = jobs.restart(i)
        jobs.save(run.path / "jobs.json")
        tqdm.write(f"warning: {why}; array task {i} started again as job {jobs.array_tasks[i].job_id} "
                   f"(restart {r.total}; {r.in_a_row} of {TASK_RESTARTS} in a row without a row served): "
                   f"it resumes its claimed rows from their checkpoints", file=sys.stderr)


def _serve_what_is_left(run: RunDir, jobs: Jobs, queue: _QueueCheck, restarts: list[_Restarts]) -> bool:
    """``pools.elastic``: every array task has ended and no other worker serves the run, yet some
    shard is neither done nor failed: a decode rank serving units was lost after the prefill
    workers ended (they leave a live claimant's units to it). Start array task 0 again to take
    them over, as :func:`_restart_killed` would (the same limit of restarts in a row with no row
    served); returns whether it was started. Not after a failed task, nor once a stop was asked."""
    if jobs.restart is None or run.stop_requested() or any(_failure(j, queue) for j in jobs.array_tasks):
        return False
    ended = set(run.done()) | set(run.failed())
    left = [s.name for s in run.shards() if s.name not in ended]
    r, rows = restarts[0], _rows_done(run)
    if rows > r.rows_at:
        r.in_a_row = 0
    if not left or r.in_a_row >= TASK_RESTARTS:
        return False
    r.total, r.in_a_row, r.rows_at = r.total + 1, r.in_a_row + 1, rows
    # The task takes the workers this launcher saw lost as dead at once (their claims' holders).
    write_json(run.path / TAKEOVER, heartbeats(run.path))
    jobs.array_tasks[0] = jobs.restart(0)
    jobs.save(run.path / "jobs.json")
    tqdm.write(f"warning: {len(left)} shards are not done and no worker serves them (a decode rank serving "
               f"units was lost; pools.elastic): array task 0 started again as job {jobs.array_tasks[0].job_id} "
               f"to take them over", file=sys.stderr)
    return True


def cancel_job(job, grace_s: float = 10.0) -> None:
    """Cancel ``job``.

    A local job is a submitit controller process running the task process. submitit cancels it
    with SIGINT to the controller, which then prints a KeyboardInterrupt traceback on the user's
    terminal; SIGTERM does not work (submitit's task ignores it). So the task gets the SIGINT
    itself (a KeyboardInterrupt inside the worker: its engine shuts down), the controller then
    ends cleanly; whatever still lives after ``grace_s`` seconds is killed.
    """
    process = getattr(job, "_process", None)
    if type(job).__name__ != "LocalJob" or process is None:
        job.cancel(check=False)
        return
    import psutil

    try:
        controller = psutil.Process(process.pid)
        tasks = controller.children()
        everything = [*controller.children(recursive=True), controller]
    except psutil.Error:
        return
    for t in tasks:
        try:
            t.send_signal(signal.SIGINT)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(everything, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def watch(run: RunDir, jobs: Jobs, total_rows: int, progress: bool = True,
          poll_s: float = 0.5, stop_grace_s: float = 120.0, joined: bool = False) -> None:
    """Wait for every owner to end, showing rows and output tokens done (and, until every engine
    is ready, how many are: ``starting engines: prefill 0/1, decode 1/1 ready``); then, once no
    other worker serves the run either (one that joined from another launch: its heartbeat lives,
    :class:`~pipeline.runtime.claims.LiveWorkers`), ask decode workers to stop and wait for them.

    An array task killed outright while shards remain (SIGKILL, out of memory: :func:`_killed`)
    is started again, as a warning, unless it was started again :data:`TASK_RESTARTS` times in a
    row with no row served by the run in between: it resumes its claimed units from their row
    checkpoints, so only its rows in flight are served again. A task that
    raised fails the run (its cause is named). A decode worker that ends while others live is
    reported as a warning: prefill workers hand its rows to the others. With ``pools.elastic``
    the last one's loss is a warning too (prefill workers then serve rows alone), and units a
    lost decode rank held once every array task ended are served by array task 0, started again
    (:func:`_serve_what_is_left`).

    ``joined``: these jobs joined a run that another launch follows (:func:`pipeline.run.join_job`):
    wait for them only; that launch stops the decode workers.

    Raises:
        RunFailed: an array task failed, or every decode worker ended while array tasks still ran
        (without ``pools.elastic``).
    """
    bars = _Bars(total_rows, progress)
    errors: list[str] = []
    warned: set[str] = set()
    queue = _QueueCheck()
    beats = _DecodeBeats(run, run.config().transport.decode_dead_after_s)
    others = _OtherWorkers(run, jobs, beats)
    restarts = [_Restarts() for _ in jobs.array_tasks]
    held: dict[str, str] = {}
    elastic = run.config().pools.elastic
    try:
        while True:
            queue.refresh(jobs.all())
            _warn_held(jobs, queue, held)
            _restart_killed(run, jobs, queue, restarts)
            own_ended = all(queue.ended(j) for j in jobs.array_tasks)
            serving_elsewhere = others.serving(own_ended)
            if own_ended and (joined or not serving_elsewhere or any(_failure(j, queue) for j in jobs.array_tasks)):
                if not (elastic and not joined and _serve_what_is_left(run, jobs, queue, restarts)):
                    break
            bars.update(run)
            bars.show_starting(run, jobs)
            dead = _failed_decode(jobs, queue, warned)
            if dead and len(dead) == len(jobs.decode) and not elastic:
                errors += [_failure(j, queue) for j in dead]
                for j in jobs.array_tasks:
                    cancel_job(j)
                break
            time.sleep(poll_s)
        bars.update(run)
    except KeyboardInterrupt:
        for j in jobs.all():
            cancel_job(j)
        raise
    finally:
        bars.close()
        if not joined:
            run.request_stop()
    array_failed = [e for e in (_failure(j, queue) for j in jobs.array_tasks) if e]
    # After a failed owner the run is over: do not wait for decode workers to wind down.
    _wind_down_decode(jobs, queue, beats, 0 if array_failed or errors or joined else stop_grace_s, poll_s)
    errors += array_failed
    if errors:
        raise RunFailed("; ".join(dict.fromkeys(errors)))


class _Bars:
    """The rows and output-token progress bars of a run, and the engines' start-up line
    (``starting engines: prefill 0/1, decode 1/1 ready``) in place of the rows' name until
    every engine is ready."""

    def __init__(self, total_rows: int, progress: bool):
        self.rows = tqdm(total=total_rows, unit="row", desc="rows", disable=not progress, dynamic_ncols=True)
        self.tokens = tqdm(unit="tok", desc="output tokens", disable=not progress, dynamic_ncols=True)
        self.progress = progress
        self.starting: str | None = "starting engines"  # until all engines are ready

    def update(self, run: RunDir) -> None:
        """Rows and output tokens done, from the run's progress files."""
        done = run.progress()
        self.rows.update(sum(p["rows"] for p in done) - self.rows.n)
        self.tokens.update(sum(p["output_tokens"] for p in done) - self.tokens.n)

    def show_starting(self, run: RunDir, jobs: Jobs) -> None:
        if self.starting and self.progress:
            self.starting = run.starting_engines(len(jobs.array_tasks), len(jobs.decode))
            self.rows.set_description_str(self.starting or "rows")

    def close(self) -> None:
        self.rows.close()
        self.tokens.close()


class _OtherWorkers:
    """Workers that serve the run from another launch (one that joined: its heartbeat lives,
    :class:`~pipeline.runtime.claims.LiveWorkers`). Heartbeats are read every 5 s (each
    worker's file), so that a killed worker's stands still from early on, and at every poll once
    this launch's tasks have ended; the decode ranks' heartbeats are read with them, so that a
    lost rank's is seen standing still early."""

    def __init__(self, run: RunDir, jobs: Jobs, beats: _DecodeBeats):
        self.live, self.jobs, self.beats = LiveWorkers(run.path, run.config().pools.claim_dead_after_s), jobs, beats
        self.checked, self.others = -1e9, None

    def serving(self, own_ended: bool) -> bool:
        """Whether any other worker serves the run, as of the last read. A decode rank's claims
        (``pools.elastic``) count only while the rank serves by its endpoint heartbeat (every
        2 s, lost after ``transport.decode_dead_after_s``), which tells a lost rank sooner than
        its claims' (``pools.claim_dead_after_s``)."""
        if own_ended or time.monotonic() - self.checked > 5:
            self.checked, self.others = time.monotonic(), self.live.live()
            if self.jobs.decode:
                ranks = {f"decode-{r}" for r in self.beats.serving()}
                self.others = [w for w in self.others if not w.startswith("decode-") or w in ranks]
        return bool(self.others)


def _failed_decode(jobs: Jobs, queue: _QueueCheck, warned: set[str]) -> list:
    """The decode jobs that failed, each warned about once (in ``warned``): prefill workers hand
    its rows to the others. A decode worker that ended cleanly did so because every shard is
    settled (its owner may still be writing its last marker); only a failed one is a loss."""
    dead = [j for j in jobs.decode if queue.ended(j) and _failure(j, queue)]
    for j in dead:
        if j.job_id not in warned:
            warned.add(j.job_id)
            tqdm.write(f"warning: {_failure(j, queue)}; its rows go to the other decode workers",
                       file=sys.stderr)
    return dead


def _wind_down_decode(jobs: Jobs, queue: _QueueCheck, beats: _DecodeBeats, grace_s: float, poll_s: float) -> None:
    """Wait up to ``grace_s`` seconds for the decode jobs to end (after :meth:`RunDir.request_stop`),
    then cancel those left. Once no rank serves any more (each stopped, or lost with its node: a
    lost node's job may stay "running" until Slurm notices, then wait for a node as a requeued
    job), their jobs get :data:`LOST_RANK_GRACE_S` to end before they are cancelled; a requeued
    one, which would only start to stop, is cancelled at once."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        queue.refresh(jobs.decode)
        if all(queue.ended(j) for j in jobs.decode):
            break
        if not beats.serving():
            deadline = min(deadline, time.monotonic() + LOST_RANK_GRACE_S)
        for j in jobs.decode:
            if j.job_id in queue.pending:  # requeued (its node lost): it would only start to stop
                queue.pending.discard(j.job_id)
                cancel_job(j)
        time.sleep(poll_s)
    for j in jobs.decode:
        if not j.done():
            cancel_job(j)
