"""CPU use of a process tree over time, sampled from ``/proc``."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from tools.benchlib.procfs import machine_busy, psi_cpu_some, read, start_time, stat_times


class ProcSampler:
    """Samples, every ``interval`` seconds, for every process under ``root_pid`` and each of its
    threads: cumulative CPU time (``/proc/.../stat`` utime + stime), cumulative time spent
    runnable but waiting for a CPU (``/proc/.../schedstat``, field 2: run-queue delay) and the
    thread's allowed CPUs; plus the machine's busy time and CPU pressure (PSI).

    ``procs`` holds, per process ever seen, its ``comm``, ``ppid``, ``cmdline``, ``start`` and
    ``bind`` (its ``VLLM_CPU_OMP_THREADS_BIND``, None where unset)."""

    def __init__(self, root_pid: int, interval: float = 1.0):
        self.root, self.interval = root_pid, interval
        # (time, machine busy s, PSI some s, {pid: cpu s}, {(pid, tid): (cpu s, run-queue wait s)})
        self.samples: list[tuple[float, float, float, dict[int, float], dict[tuple[int, int], tuple]]] = []
        self.procs: dict[int, dict[str, Any]] = {}
        self.threads: dict[tuple[int, int], dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "ProcSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def kill_leftovers(self) -> list[str]:
        """SIGKILL every process of this run still alive after its root ended (an engine core
        orphaned by a crash would otherwise burn CPU in later runs); returns their names. Only
        processes this sampler saw under the root, with the same start time, are touched."""
        left = []
        for pid, info in self.procs.items():
            st = read(f"/proc/{pid}/stat")
            if not st or pid == self.root or start_time(st) != info.get("start"):
                continue
            try:
                os.kill(pid, 9)
                left.append(f"{pid} {info['comm']}")
            except OSError:
                pass
        return left

    def _tree(self) -> list[int]:
        kids: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            st = read(f"/proc/{name}/stat")
            if st:
                try:
                    kids.setdefault(stat_times(st)[1], []).append(int(name))
                except (ValueError, IndexError):
                    pass
        out, todo = [], [self.root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(kids.get(p, []))
        return out

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                self.sample()
                return

    def sample(self) -> None:
        t, busy, psi = time.time(), machine_busy(), psi_cpu_some()
        procs: dict[int, float] = {}
        threads: dict[tuple[int, int], tuple[float, float]] = {}
        for pid in self._tree():
            st = read(f"/proc/{pid}/stat")
            if not st:
                continue
            comm, ppid, cpu = stat_times(st)
            procs[pid] = cpu
            if pid not in self.procs:
                self.procs[pid] = {"comm": comm, "ppid": ppid, "cmdline": (
                    read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")[:200], "bind": None,
                    "start": start_time(st)}
            info = self.procs[pid]
            if info["bind"] is None:
                env = read(f"/proc/{pid}/environ") or ""
                for kv in env.split("\0"):
                    if kv.startswith("VLLM_CPU_OMP_THREADS_BIND="):
                        info["bind"] = kv.split("=", 1)[1]
            info["comm"] = comm  # vLLM renames its processes after start
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                base = f"/proc/{pid}/task/{tid}"
                tst = read(f"{base}/stat")
                if not tst:
                    continue
                tcomm, _, tcpu = stat_times(tst)
                sched = (read(f"{base}/schedstat") or "0 0 0").split()
                threads[(pid, int(tid))] = (tcpu, int(sched[1]) / 1e9)
                status = read(f"{base}/status") or ""
                allowed = next((ln.split(":", 1)[1].strip() for ln in status.splitlines()
                                if ln.startswith("Cpus_allowed_list")), "?")
                self.threads[(pid, int(tid))] = {"comm": tcomm, "cpus": allowed}
        self.samples.append((t, busy, psi, procs, threads))

    def _at(self, t: float, get) -> float:
        """A cumulative counter at time ``t``, linearly interpolated between samples; 0 before
        the counter was first seen, its last value after it disappeared (a process that ended)."""
        prev_t, prev_v, last = None, 0.0, 0.0
        for s in self.samples:
            v = get(s)
            v = last if v is None else v
            last = v
            if s[0] >= t:
                if prev_t is None or s[0] <= prev_t:
                    return v if prev_t is not None else (v if s[0] == t else prev_v)
                return prev_v + (v - prev_v) * (t - prev_t) / (s[0] - prev_t)
            prev_t, prev_v = s[0], v
        return last

    def _delta(self, t0: float, t1: float, get) -> float:
        return self._at(t1, get) - self._at(t0, get)

    def window(self, t0: float, t1: float, labels: dict[int, str]) -> dict[str, Any]:
        """Between ``t0`` and ``t1``, divided by ``t1 - t0`` (so 1.0 = one core, or one thread
        waiting all the time): CPU per process label and per (label, thread name); run-queue wait
        per process label; this run's total CPU; the machine's other busy time; the fraction of
        the window in which some task of the machine waited for a CPU (PSI ``some``)."""
        span = max(t1 - t0, 1e-9)
        by_label: dict[str, float] = {}
        wait_label: dict[str, float] = {}
        for pid in self.procs:
            lab = labels.get(pid, "other")
            by_label[lab] = by_label.get(lab, 0.0) + self._delta(t0, t1, lambda s, p=pid: s[3].get(p))
        by_thread: dict[tuple[str, str, str], float] = {}
        wait_thread: dict[tuple[str, str, str], float] = {}
        for key, info in self.threads.items():
            lab = labels.get(key[0], "other")
            cpu = self._delta(t0, t1, lambda s, k=key: (s[4].get(k) or (None, None))[0])
            wait = self._delta(t0, t1, lambda s, k=key: (s[4].get(k) or (None, None))[1])
            k2 = (lab, info["comm"] + (" (main thread)" if key[0] == key[1] else ""), info["cpus"])
            by_thread[k2] = by_thread.get(k2, 0.0) + cpu
            wait_thread[k2] = wait_thread.get(k2, 0.0) + wait
            wait_label[lab] = wait_label.get(lab, 0.0) + wait
        ours = sum(by_label.values())
        machine = self._delta(t0, t1, lambda s: s[1])
        psi = self._delta(t0, t1, lambda s: s[2])
        top = sorted(by_thread.items(), key=lambda kv: -(kv[1] + wait_thread[kv[0]]))[:16]
        return {
            "span_s": span,
            "cores_by_process": {k: v / span for k, v in sorted(by_label.items())},
            "runqueue_wait_by_process": {k: v / span for k, v in sorted(wait_label.items())},
            "top_threads": [{"process": k[0], "thread": k[1], "allowed_cpus": k[2], "cores": v / span,
                             "runqueue_wait": wait_thread[k] / span} for k, v in top if v > 0 or wait_thread[k] > 0],
            "run_cores": ours / span,
            "other_load_cores": max(0.0, machine - ours) / span,
            "cpu_pressure_some": psi / span if psi == psi else None,
        }
