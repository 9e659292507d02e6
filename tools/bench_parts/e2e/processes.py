"""One benchmarked process tree of ``tools/bench.py``: run with its CPU use sampled, its vLLM
processes named by role, stacks dumped on a timeout, leftovers killed, a failure retried once."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.benchlib.procfs import alive, read
from tools.benchlib.procs import spawn, stop
from tools.benchlib.sampling import ProcSampler


class RunError(RuntimeError):
    """A benchmarked run failed or timed out; the message names its log."""


def label_processes(sampler: ProcSampler, roles_by_bind: dict[str, str]) -> dict[int, str]:
    """Name every sampled process by its role (from its ``VLLM_CPU_OMP_THREADS_BIND``, which
    the worker sets before vLLM spawns its engine) and its part: ``<role> engine core`` (vLLM's
    ``EngineCore`` process: scheduler, KV connector), ``<role> model worker`` (its model runner
    process, whose OpenMP threads do the math), ``<role> front-end`` (the worker process that
    spawned the engine: AsyncLLM / LLM, asyncio, shard I/O; its own environment predates the
    binding), ``launcher`` for the root, else ``other`` (submitit controllers, trackers)."""
    procs = sampler.procs
    labels = {sampler.root: "launcher"}
    for pid, info in procs.items():
        if info["bind"] is None or pid == sampler.root:
            continue
        role = roles_by_bind.get(info["bind"], f"cores {info['bind']}")
        parent = procs.get(info["ppid"])
        if parent is not None and parent["bind"] is not None and info["ppid"] != sampler.root:
            labels[pid] = f"{role} model worker"
        else:
            labels[pid] = f"{role} engine core"
            if parent is not None and info["ppid"] != sampler.root:
                labels[info["ppid"]] = f"{role} front-end"
    for pid in procs:
        labels.setdefault(pid, "other")
    return labels


def run_sampled(cmd: list[str], log: Path, args: argparse.Namespace,
                env: dict[str, str] | None = None) -> tuple[int, ProcSampler, float, list[str]]:
    """Run ``cmd`` (output to ``log``) while sampling its process tree's CPU use.

    Returns (exit status, sampler, launch time, leftover processes killed). After
    ``args.run_timeout`` seconds the tree's Python stacks are dumped with py-spy (when installed)
    into ``<log>.stacks`` and the run is terminated (status -15). Processes of the tree still
    alive after its root ended are killed (SIGKILL; vLLM engine processes get 15 s to end
    first); the vLLM engine processes among them are returned.
    """
    t_launch = time.time()
    with open(log, "w") as f:
        proc = spawn(cmd, f, env)
        sampler = ProcSampler(proc.pid, args.sample_s).start()
        try:
            rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            _dump_stacks(sampler, Path(f"{log}.stacks"))
            rc = stop(proc, grace_s=60)
        sampler.stop()
    # vLLM's engine processes end shortly after their worker; give them 15 s, then kill what is
    # left (idle helpers such as multiprocessing's resource tracker are killed at once).
    deadline = time.time() + 15
    while time.time() < deadline and any(
            alive(p) for p, i in sampler.procs.items() if p != sampler.root and i["bind"]):
        time.sleep(0.5)
    left = sampler.kill_leftovers()
    return rc, sampler, t_launch, [x for x in left if "VLLM" in x or "EngineCor" in x]


def _dump_stacks(sampler: ProcSampler, path: Path) -> None:
    spy = Path(sys.executable).with_name("py-spy")
    with open(path, "w") as f:
        for pid, info in sampler.procs.items():
            if not alive(pid):
                continue
            f.write(f"== pid {pid} {info['comm']} (ppid {info['ppid']}, cores {info['bind']}) "
                    f"wchan {read(f'/proc/{pid}/wchan')}\n")
            f.flush()
            if spy.exists():
                subprocess.run([str(spy), "dump", "--pid", str(pid)], stdout=f, stderr=subprocess.STDOUT,
                               timeout=60, check=False)


def with_retry(fn: Callable[[], dict[str, Any]], name: str, rep: int, failures: list[dict]) -> dict[str, Any] | None:
    """``fn()``, once more if it raises :class:`RunError` (the failure is recorded)."""
    for attempt in (1, 2):
        try:
            return fn()
        except RunError as exc:
            failures.append({"config": name, "repeat": rep, "attempt": attempt, "error": str(exc)[-3000:]})
            print(f"{name} repeat {rep + 1}: FAILED (attempt {attempt}): {str(exc)[:600]}",
                  file=sys.stderr, flush=True)
            if attempt == 2:
                return None
    return None
