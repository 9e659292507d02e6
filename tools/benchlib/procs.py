"""Child processes of a benchmark: started in the repository root with their output in a log,
waited for within a deadline, stopped; ``python -m pipeline`` runs."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import IO

from tools.benchlib import REPO


def python(*args: object) -> list[str]:
    """The command line running this interpreter with ``args``."""
    return [sys.executable, *(str(a) for a in args)]


def pipeline_command(*overrides: str) -> list[str]:
    """The command line of a pipeline run (``python -m pipeline OVERRIDES``)."""
    return python("-m", "pipeline", *overrides)


def spawn(cmd: Sequence[str], log: IO, env: dict[str, str] | None = None,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``cmd`` in the repository root, its stdout and stderr written to the open file
    ``log``; ``pass_fds``: file descriptors it inherits."""
    return subprocess.Popen(list(cmd), cwd=REPO, env=env, pass_fds=tuple(pass_fds), stdout=log,
                            stderr=subprocess.STDOUT)


def wait_all(procs: Iterable[subprocess.Popen], timeout: float) -> None:
    """Wait for each process in turn, all of them within ``timeout`` seconds (at least 1 s for
    each); those still running afterwards are left running."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def stop(proc: subprocess.Popen, grace_s: float = 0.0) -> int:
    """End ``proc`` if it still runs: SIGTERM and up to ``grace_s`` seconds to exit, then SIGKILL
    (at once where ``grace_s`` is 0). Returns its exit status."""
    if proc.poll() is None and grace_s > 0:
        proc.terminate()
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        proc.kill()
    return proc.wait()


def run_pipeline(overrides: Sequence[str], what: str) -> subprocess.CompletedProcess:
    """Run the pipeline with ``overrides`` in the repository root, its output captured.

    Raises:
        SystemExit: it failed; the message names ``what`` and ends with its output's tails.
    """
    p = subprocess.run(pipeline_command(*overrides), cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed (exit status {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return p
