"""A worker's engine processes end with the worker, however it ends.

vLLM's engine core and model workers are processes of their own (``VLLM::EngineCore``,
``VLLM::Worker``) that do not watch the worker process that started them: a worker killed
outright (SIGKILL, the out-of-memory killer) leaves them running, re-parented to init, each with
its KV cache (~3.5 GB each with the bundled model's defaults, measured in the chaos soak,
``tools/soak.py``). A restarted worker then starts a second engine beside them. Slurm ends them
only where its process tracking follows them (``ProctrackType=proctrack/cgroup``, docs/slurm.md);
on a laptop nothing does.

:class:`EngineReaper` starts a small process (``python -m pipeline.engine.reaper``) that reads
the engine processes' ids from a pipe the worker holds open. When the worker ends, for whatever
reason, the kernel closes the pipe; the reaper reads its end and SIGKILLs each listed process
still alive (checked against its start time, so a reused id is left alone). The worker's output
is durable before it stops its engine, so nothing the engine holds then is needed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import psutil


class EngineReaper:
    """The reaper of one worker's engine processes (see the module doc). :meth:`watch` names the
    processes; the reaper ends them once this process has ended."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "pipeline.engine.reaper"], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, text=True, start_new_session=True)
        self._named: set[tuple[int, float]] = set()
        self._lock = threading.Lock()

    def watch(self, processes: list[psutil.Process]) -> None:
        """Name ``processes`` (this worker's engine processes) to be killed when this process
        ends; each is sent once. Never raises: a reaper that is gone only costs the cleanup."""
        with self._lock:
            lines = []
            for p in processes:
                try:
                    key = (p.pid, p.create_time())
                except psutil.Error:
                    continue
                if key not in self._named:
                    self._named.add(key)
                    lines.append(f"{key[0]} {key[1]!r}\n")
            if lines:
                try:
                    self._proc.stdin.write("".join(lines))
                    self._proc.stdin.flush()
                except (OSError, ValueError):
                    pass

    def watch_descendants(self) -> None:
        """:meth:`watch` every descendant of this process but the reaper itself."""
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        self.watch([c for c in children if c.pid != self._proc.pid])


def main() -> None:
    """The reaper process: read ``PID CREATE_TIME`` lines until the worker's end of the pipe
    closes, then SIGKILL each process still alive with that start time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the worker is not for the reaper
    named = []
    for line in sys.stdin:
        pid, created = line.split()
        named.append((int(pid), float(created)))
    for pid, created in named:
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                p.kill()
        except psutil.Error:
            continue
    os._exit(0)


if __name__ == "__main__":
    main()
