"""Reading ``/proc``: a process's CPU time, the machine's busy time and CPU pressure."""

from __future__ import annotations

import os
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def read(path: str) -> str | None:
    """The text of ``path``, or None where it cannot be read (a process that ended)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def stat_times(text: str) -> tuple[str, int, float]:
    """(comm, ppid, utime + stime in seconds) from a /proc stat line."""
    lp, rp = text.index("("), text.rindex(")")
    comm = text[lp + 1:rp]
    f = text[rp + 2:].split()
    return comm, int(f[1]), (int(f[11]) + int(f[12])) / CLK_TCK


def start_time(text: str) -> str:
    """The start time (clock ticks after boot, as written) from a /proc stat line: with the pid,
    it tells a process from a later one that reuses its pid."""
    return text.split(")")[-1].split()[19]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (its /proc stat can be read)."""
    return bool(read(f"/proc/{pid}/stat"))


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    f = [int(x) for x in read("/proc/stat").split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / CLK_TCK


def psi_cpu_some() -> float:
    """Seconds since boot during which some runnable task waited for a CPU (/proc/pressure/cpu),
    or NaN where PSI is unavailable."""
    text = read("/proc/pressure/cpu") or ""
    for ln in text.splitlines():
        if ln.startswith("some"):
            return int(ln.rsplit("total=", 1)[1]) / 1e6
    return float("nan")


def load_1m() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def wait_quiet(max_wait_s: float, threshold: float) -> dict[str, float]:
    """Wait (at most ``max_wait_s``) until the machine's busy CPU over 3 s is below
    ``threshold`` cores (other work shares these cores). Returns the wait and the last level."""
    t0, level = time.time(), 0.0
    while True:
        b0, w0 = machine_busy(), time.time()
        time.sleep(3)
        level = (machine_busy() - b0) / (time.time() - w0)
        if level < threshold or time.time() - t0 >= max_wait_s:
            return {"waited_s": time.time() - t0, "busy_cores_before": level}
