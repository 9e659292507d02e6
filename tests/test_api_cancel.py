"""``RunHandle.cancel()`` (the Python API, issue #41): a local run cancelled while its engines
start leaves no process behind (the workers, their vLLM engine cores), asks the run to stop, and
``wait()`` then returns at once with nothing done. Processes are read from the operating system
(psutil), not from the pipeline."""

from __future__ import annotations

import time

import psutil
import pytest

from pipeline import submit
from tests.helpers import SAMPLE

pytestmark = pytest.mark.e2e


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _names(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(p.name())
        except psutil.Error:
            continue
    return out


def test_cancel_stops_every_process_and_asks_the_run_to_stop(tmp_path):
    before = {p.pid for p in _descendants()}
    handle = submit("+job=summarize", f"job.input={SAMPLE}", f"run.dir={tmp_path / 'run'}", "run.progress=false")
    deadline = time.monotonic() + 180
    while not any(n.startswith("VLLM::EngineCor") for n in _names(_descendants())):  # an engine is starting
        assert time.monotonic() < deadline, f"no engine core started: {_names(_descendants())}"
        assert not handle.status()["finished"], "the run ended before it could be cancelled"
        time.sleep(0.5)
    procs = [p for p in _descendants() if p.pid not in before]
    started = time.monotonic()
    handle.cancel()
    assert time.monotonic() - started < 30
    _, alive = psutil.wait_procs(procs, timeout=15)
    assert not alive, f"left running: {_names(alive)}"
    assert (tmp_path / "run" / "stop").exists()
    t = time.monotonic()
    summary = handle.wait()
    assert time.monotonic() - t < 5
    assert summary.shards_done == 0 and summary.shards == 3
