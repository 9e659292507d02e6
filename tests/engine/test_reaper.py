"""The reaper of a worker's engine processes (pipeline.engine.reaper), without an engine: a
"worker" process names a child to its reaper and is then killed with SIGKILL, as the OOM killer
would; the child must end with it. What is alive is read from the operating system. (Killing a
real worker and its engine is tests/roles/test_faults.py's killed-worker test.)"""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil

from tests.helpers import ROOT

WORKER = """
import subprocess, sys
from pipeline.engine.reaper import EngineReaper
reaper = EngineReaper()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
reaper.watch_descendants()
print(child.pid, reaper._proc.pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_the_named_processes_end_when_their_worker_is_killed_and_others_are_left():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    worker = subprocess.Popen([sys.executable, "-c", WORKER], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        child_pid, reaper_pid = map(int, worker.stdout.readline().split())
        child, reaper = psutil.Process(child_pid), psutil.Process(reaper_pid)
        assert child.is_running() and reaper.is_running()
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        gone, alive = psutil.wait_procs([child, reaper], timeout=10)
        assert not alive, alive
        assert bystander.poll() is None  # not named: left alone
    finally:
        bystander.kill()
        worker.kill()
