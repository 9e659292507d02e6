"""Pinning an engine's processes while it starts (pipeline.engine.env.pinned_descendants): a child
process that moves one of its threads off the worker's cores mid-start (as vLLM's NIXL connector
does to the model worker's main thread) is brought back within the start, not only after it. The
child is a plain Python process; the affinity it reads back comes from the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipeline.engine.env import pinned_descendants

CORES = sorted(os.sched_getaffinity(0))

# Moves itself to the last core, says so, then prints its affinity each time it is asked.
CHILD = """
import os, sys
os.sched_setaffinity(0, {%d})
print("moved", flush=True)
for line in sys.stdin:
    print(",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
""" % CORES[-1]


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to move a thread between")
def test_a_thread_moved_off_the_cores_during_start_is_brought_back_before_the_start_ends():
    first = {CORES[0]}
    with pinned_descendants(first, every_s=0.05):
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout.readline().strip() == "moved"
            deadline = time.monotonic() + 10
            while True:  # still inside the block: only the periodic pass can have moved it back
                child.stdin.write("?\n")
                child.stdin.flush()
                seen = {int(c) for c in child.stdout.readline().split(",")}
                if seen == first or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert seen == first
        finally:
            child.stdin.close()
            child.wait(10)


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to confine a worker to one of them")
def test_a_worker_given_a_core_list_runs_with_its_engine_and_one_given_a_slice_stays_where_it_started():
    """A worker given its cores by ``cluster.decode_cpus`` / ``prefill_cpus`` is confined to them,
    every thread it has and starts (read back from the kernel); the local launcher's slices
    leave it where it started."""
    import threading

    from pipeline.config import compose
    from pipeline.engine.env import pin_worker, worker_pin

    last = str(CORES[-1])
    # The local launcher's slice: no list in the config.
    assert worker_pin(compose(["+job=summarize"]), "decode", last) is None
    cfg = compose(["+job=summarize", f"cluster.decode_cpus='{CORES[0]};{last}'"])
    assert worker_pin(cfg, "decode", last) == {CORES[-1]}
    assert worker_pin(cfg, "prefill", last) is None  # prefill_cpus is not set
    assert worker_pin(cfg, "decode", None) is None

    def child() -> None:
        seen.append(os.sched_getaffinity(0))
        go.wait(10)
        seen.append(os.sched_getaffinity(0))

    seen: list[set[int]] = []
    go = threading.Event()
    before = os.sched_getaffinity(0)
    t = threading.Thread(target=child)
    t.start()
    try:
        pin_worker({CORES[-1]})
        go.set()
        t.join()
        later: list[set[int]] = []
        t2 = threading.Thread(target=lambda: later.append(os.sched_getaffinity(0)))
        t2.start()
        t2.join()
        assert os.sched_getaffinity(0) == {CORES[-1]}
        assert seen == [before, {CORES[-1]}] and later == [{CORES[-1]}], (seen, later)
    finally:
        pin_worker(before)


def test_a_core_the_worker_may_not_use_is_refused_naming_the_settings():
    from pipeline.engine.env import pin_worker

    before = os.sched_getaffinity(0)
    with pytest.raises(OSError, match=r"cannot run this worker on cores \[\d+\] \(cluster.prefill_cpus / decode_cpus\)"):
        pin_worker({max(CORES) + 64})
    assert os.sched_getaffinity(0) == before
