"""The launcher's view of its jobs (pipeline.launch.watch), without engines: which decode ranks
still serve, and which were lost, from the endpoint files the ranks write; killed array tasks
started again (real submitit jobs); jobs Slurm holds, and jobs that just ended (real jobs on the
test Slurm)."""

from __future__ import annotations

import time

import pytest

from pipeline.launch.watch import _DecodeBeats
from pipeline.runtime.rundir import RunDir


def test_a_rank_whose_heartbeat_stands_still_is_lost_and_stays_named_after_a_requeue(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "decode").mkdir()
    run.publish_decode(0, "tcp://198.18.0.3:1", "decode-0@pd-node3")
    run.publish_decode(1, "tcp://198.18.0.4:1", "decode-1@pd-node4")
    first_look = time.monotonic()
    beats = _DecodeBeats(run, dead_after_s=0.3)
    assert beats.serving() == [0, 1]
    # Rank 0 beats, rank 1 does not: rank 1 is lost once its heartbeat has stood still for 0.3 s
    # of this clock, not before (waited for, not slept).
    deadline = first_look + 10
    while (serving := beats.serving()) != [0]:
        assert serving == [0, 1] and not beats.lost and time.monotonic() < deadline, (serving, beats.lost)
        run.publish_decode(0, "tcp://198.18.0.3:1", "decode-0@pd-node3")
    assert time.monotonic() - first_look >= 0.3
    assert beats.lost == {1: "decode-1@pd-node4"}
    # Rank 1 requeued onto pd-node3 and stopped cleanly; rank 0 stopped: nobody serves, and
    # rank 1 is still named as lost during the run.
    run.publish_decode(1, "tcp://198.18.0.3:2", "decode-1@pd-node3", stopped=True)
    run.publish_decode(0, "tcp://198.18.0.3:1", "decode-0@pd-node3", stopped=True)
    assert beats.serving() == []
    assert run.lost_decode() == {1: "decode-1@pd-node4"}


def test_a_rank_that_never_stopped_counts_as_lost_at_the_end(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "decode").mkdir()
    run.publish_decode(0, "tcp://127.0.0.1:1", "decode-0@x", stopped=True)
    run.publish_decode(1, "tcp://127.0.0.1:2", "decode-1@x")  # killed: no last beat
    assert run.lost_decode() == {1: "decode-1@x"}


def _killed_outright() -> None:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_task_is_started_again_while_rows_are_served_but_not_in_a_loop(tmp_path):
    """Real submitit local jobs, each SIGKILLed at once: restarted until TASK_RESTARTS restarts in
    a row saw no row served; a row served since (a progress file, as a worker writes) lets the
    next kill be restarted again, so a long run survives any number of recovered faults."""
    import submitit

    from pipeline.config import compose
    from pipeline.io.shards import list_shards
    from pipeline.launch.watch import TASK_RESTARTS, Jobs, _QueueCheck, _restart_killed, _Restarts
    from tests.helpers import SAMPLE

    cfg = compose(["+job=summarize", f"job.input={SAMPLE}", f"run.dir={tmp_path / 'run'}"])
    run = RunDir(tmp_path / "run")
    run.create(cfg, list_shards(SAMPLE), str(tmp_path / "out"))
    executor = submitit.LocalExecutor(folder=tmp_path / "logs")
    jobs = Jobs(array_tasks=[executor.submit(_killed_outright)], restart=lambda i: executor.submit(_killed_outright))
    restarts, queue = [_Restarts()], _QueueCheck()

    def kill_and_watch() -> bool:
        job = jobs.array_tasks[0]
        job.wait()
        _restart_killed(run, jobs, queue, restarts)
        return jobs.array_tasks[0] is not job

    assert [kill_and_watch() for _ in range(TASK_RESTARTS + 1)] == [True] * TASK_RESTARTS + [False]
    run.write_progress("prefill-0@x", {"rows": 3, "tokens": 3})
    assert kill_and_watch() is True
    assert kill_and_watch() is True and kill_and_watch() is False  # 2 in a row again (TASK_RESTARTS=2)
    assert restarts[0].total == TASK_RESTARTS + 2 and TASK_RESTARTS == 2


@pytest.mark.slurm
def test_a_job_slurm_holds_is_named_with_how_to_release_it(slurm_cluster, tmp_path, capsys):
    """A real job on the test Slurm, held (``sbatch --hold``: squeue's reason ``JobHeldUser``, as
    ``launch failed requeued held`` or an operator's ``JobHeldAdmin`` would be): the launcher says
    once which of the run's jobs it is and how to release it, then that it was released."""
    import subprocess

    import submitit

    from pipeline.launch.queue import _QueueCheck, warn_held as _warn_held
    from pipeline.launch.watch import Jobs

    out = subprocess.run(["sbatch", "--parsable", "--hold", "-p", "debug", f"--output={tmp_path}/%j.out",
                          "--wrap", "sleep 30"], capture_output=True, text=True, check=True).stdout
    job_id = out.strip().split(";")[0]
    job = submitit.SlurmJob(tmp_path, job_id)
    jobs, queue, warned = Jobs(array_tasks=[job]), _QueueCheck(every_s=0), {}
    try:
        queue.refresh(jobs.all())
        assert queue.held == {job_id: "JobHeldUser"}, queue.held
        _warn_held(jobs, queue, warned)
        _warn_held(jobs, queue, warned)  # once, not at every poll
        err = capsys.readouterr().err
        assert err.count(f"job {job_id} (array task 0) is held by Slurm (JobHeldUser)") == 1, err
        assert f"`scontrol release {job_id}`" in err and "the run waits for its rows" in err, err
        subprocess.run(["scontrol", "release", job_id], check=True)
        queue.refresh(jobs.all())
        assert queue.held == {} and job_id in queue.listed, (queue.held, queue.listed)
        _warn_held(jobs, queue, warned)
        assert f"job {job_id} (array task 0) was released" in capsys.readouterr().err
    finally:
        subprocess.run(["scancel", job_id])


@pytest.mark.slurm
def test_a_job_that_wrote_its_result_is_seen_ended_within_seconds_not_at_the_next_10_s_ask(slurm_cluster, tmp_path):
    """Real jobs on the test Slurm. One writes its result (as submitit does just before it exits)
    and ends a second later: the launcher's queue view, asking ``squeue`` every 10 s, sees it
    ended within ``soon_s`` + 1 s of the moment this test's own ``squeue`` calls (every 0.2 s)
    stop listing it, not up to 10 s later. Another runs on with a result already on disk (a
    requeued job's earlier attempt): asked about every ``soon_s`` for ``soon_for_s`` only."""
    import subprocess

    import submitit

    from pipeline.launch.queue import _QueueCheck

    def sbatch(script: str) -> submitit.SlurmJob:
        out = subprocess.run(["sbatch", "--parsable", "-p", "debug", f"--output={tmp_path}/%j.out", "--wrap", script],
                             capture_output=True, text=True, check=True).stdout
        return submitit.SlurmJob(tmp_path, out.strip().split(";")[0])

    def listed(job_id: str) -> bool:
        return subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip() != ""

    ending = sbatch(f"sleep 3; touch {tmp_path}/${{SLURM_JOB_ID}}_0_result.pkl; sleep 1")
    running = sbatch("sleep 60")
    queue = _QueueCheck(every_s=10.0, soon_s=1.0, soon_for_s=3.0)
    try:
        deadline, left_at, seen_at = time.monotonic() + 60, None, None
        while seen_at is None and time.monotonic() < deadline:
            queue.refresh([ending])
            if queue.ended(ending):
                seen_at = time.monotonic()
            if left_at is None and not listed(ending.job_id):
                left_at = time.monotonic()
            time.sleep(0.2)
        assert seen_at is not None and left_at is not None, (seen_at, left_at)
        assert seen_at - left_at <= queue.soon_s + 1.0, seen_at - left_at
        # The running job, listed, its result already there: asked about every second for
        # soon_for_s (3 s), then every 10 s again.
        while not listed(running.job_id) or "RUNNING" not in subprocess.run(
                ["squeue", "-h", "-o", "%T", "-j", running.job_id], capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        queue = _QueueCheck(every_s=10.0, soon_s=1.0, soon_for_s=3.0)
        queue.refresh([running])  # first ask: listed, running
        running.paths.result_pickle.parent.mkdir(parents=True, exist_ok=True)
        running.paths.result_pickle.touch()
        asks, start = [], time.monotonic()
        while time.monotonic() - start < 8:
            before = queue.last
            queue.refresh([running])
            if queue.last != before:
                asks.append(queue.last - start)
            time.sleep(0.1)
        assert not queue.ended(running)
        # 1 s apart while the 3 s window lasts (seen at the first poll), then none until 10 s.
        assert 2 <= len(asks) <= 4 and asks[-1] < 5, asks
    finally:
        subprocess.run(["scancel", ending.job_id, running.job_id])
