"""End-to-end benchmark: the pipeline against raw vLLM, and disaggregated against colocated.

What it measures, in one run, on this machine, over the same prompts (Parquet inputs it builds
itself in a temporary directory from CPython standard-library docstrings, PSF License):

1. **Pipeline colocated vs raw vLLM** (``raw``, ``coloc1``), uniform short workload. The pipeline
   runs ``python -m pipeline +job=summarize pools=colocated pools.prefill=1`` (one worker on
   every core: ``cluster.cpu_bind=partition`` gives it ``cpu_slices(1)``, i.e. all cores) with
   ``job.batch_rows`` = all rows, so every row is in flight at once. Raw vLLM is
   ``vllm.LLM.generate`` in a child process over the same token ids, rendered by the pipeline's
   own :func:`pipeline.data.prompts.make_prompts` from the config the pipeline composes
   (``pipeline.config.compose`` with the same overrides), with the same sampling (greedy,
   ``max_new_tokens``), dtype, ``max_model_len``, ``enforce_eager``, ``gpu_memory_utilization``,
   seed, and the same process environment (``pipeline.roles.engine.engine_env``: the KV cache
   size ``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND`` = the colocated worker's cores,
   ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``), and its engine's threads pinned the same way
   (``pin_descendants``), and the scheduler limits the pipeline's ``AsyncLLM`` resolves
   (``max_num_batched_tokens``, ``max_num_seqs``: vLLM gives ``LLM`` larger defaults on CPU).
   All prompts go to one ``generate()`` call.
2. **Disaggregated vs colocated on the same cores** (``coloc2``, ``disagg``), on a uniform short
   workload and on a mixed one (``--long-frac`` of the rows ~``--long-tokens`` tokens, the rest
   short): ``pools=colocated pools.prefill=2`` (two colocated workers, one core each, each owning
   half of the shards) against ``pools=disaggregated pools.prefill=1 pools.decode=1`` (prefill on
   core 0, decode on core 1). Both get the same total number of rows in flight (``--inflight``):
   ``job.batch_rows`` = inflight / 2 per colocated worker, = inflight for the single prefill
   owner. More rows than ``--inflight`` means rows enter as others finish, so new prefills meet
   running decodes, which is where disaggregation should help.
3. **Hand-off overhead** per disaggregated request, from ``RUN_DIR/metrics``: the hand-off
   message (``decode_arrived_at - prefill_end``: ZeroMQ send, HMAC, decode's receive loop) and KV
   transfer + scheduling until the first decode token (``token_times[0] - decode_arrived_at``),
   p50 / p99 / max. The one-time NIXL handshake (and first-step warm-up of the decode engine) is
   estimated as the extra of the request that reached the decode worker first over the run's
   median: ``(first - median)`` of ``token_times[0] - decode_arrived_at``.
4. The KV transfer microbenchmark is ``tools/bench_kv.py``; ``--kv`` runs it once (a short
   setting) and appends its output.

How figures are measured:

- **Output tokens/s** excludes engine start-up on both sides. Pipeline: ``output_tokens /
  wall_s`` of :func:`pipeline.report.summarize_run`, where ``wall_s`` runs from the first row's
  ``read_at`` (its shard was read, after the engine started) to the last output token of any
  row; the figure from the first ``prefill_start`` (excluding shard read and tokenization) is
  shown too. Raw vLLM: output tokens / the time around ``generate()``. With two colocated
  workers, one engine often starts seconds before the other and serves alone meanwhile, which
  ``summarize_run``'s single window counts against the run; the part 2 comparison therefore
  also gives (and judges by) the sum over shard owners of each owner's tokens / (its last token
  - its first ``read_at``), i.e. each engine's own start-up removed (identical for one owner).
- **TTFT** p50/p99, **ITL** p50/p99/max and **stalls** (ITL gaps > ``--stall-ms``, default 60)
  come from ``summarize_run`` (TTFT from ``prefill_start``; ITL pooled over every request; see
  :mod:`pipeline.report`). Each stall is also attributed by overlap: another request on the same
  engine was being prefilled during the gap (colocated: its ``prefill_start`` to its first
  token; disaggregated decode: its ``decode_arrived_at`` to its first token, i.e. KV arrival and
  the 1-token step), else only the prefill worker (other core) was prefilling, else nothing.
  Overlap is not proof of cause: where every decode step is longer than the threshold, every
  gap is a stall, and the longest gap per cause says more.
- **CPU use**: while a run goes, a sampler reads ``/proc`` every ``--sample-s`` seconds for every
  process of the run (launcher, worker front-ends, vLLM engine cores and model workers, told
  apart by their ``VLLM_CPU_OMP_THREADS_BIND``) and every thread of them: CPU time, run-queue
  wait (``schedstat``: runnable but not running, i.e. waiting for its core) and allowed CPUs.
  The tables give seconds per second of the measured window (1.0 = one core busy, or one thread
  always waiting), the busiest threads, the machine's other load (``/proc/stat`` busy time
  minus this run's; other work shares these cores) and CPU pressure (PSI ``some``). Engine
  step counts (and steps that computed no token) come from ``RUN_DIR/metrics/workers``.
- Every figure is the **median over ``--repeats``** runs, each a fresh engine start; repeats go
  round-robin over the configurations, so a slow phase of the machine hits every configuration,
  and each run waits up to ``--quiet-wait-s`` for the machine to be quiet first. Ratios are
  ratios of medians. A run that fails or exceeds ``--run-timeout`` (its Python stacks are then
  dumped with py-spy next to its log) is retried once and listed.

Run from the repository root (about 20 minutes on 2 cores with the defaults: ~18 runs, each
spending 40-90 s starting and stopping its engines)::

    .venv/bin/python tools/bench.py [--repeats 3] [--rows 16] [--inflight 8] \\
        [--max-new-tokens 64] [--only raw,coloc,disagg] [--workloads uniform,mixed] \\
        [--json out.json] [--keep] [--kv]

It prints markdown tables (progress on stderr); ``--json`` also writes every per-repeat figure.
``--keep`` keeps the work directory (inputs, run directories with logs and metrics) for
``python -m pipeline.report RUN_DIR``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIGS = {
    # name: (part, workload, description)
    "raw": ("raw", "uniform", "raw vLLM LLM.generate, all cores"),
    "coloc1": ("coloc", "uniform", "pipeline colocated, 1 worker on all cores"),
    "coloc2-uniform": ("coloc", "uniform", "colocated 2 workers x 1 core"),
    "disagg-uniform": ("disagg", "uniform", "disaggregated 1P (core 0) + 1D (core 1)"),
    "coloc2-mixed": ("coloc", "mixed", "colocated 2 workers x 1 core"),
    "disagg-mixed": ("disagg", "mixed", "disaggregated 1P (core 0) + 1D (core 1)"),
    # before pipeline.kv.connector: NIXL's progress thread busy-polls (transport.nixl_progress_delay_us=0)
    "disaggspin-uniform": ("disaggspin", "uniform", "disaggregated, NIXL progress thread spinning"),
    "disaggspin-mixed": ("disaggspin", "mixed", "disaggregated, NIXL progress thread spinning"),
    # prefill engine steps of at most 512 tokens (model.prefill_chunk_tokens; default: vLLM's 2048)
    "disaggchunk-uniform": ("disaggchunk", "uniform", "disaggregated, prefill chunks of 512 tokens"),
    "disaggchunk-mixed": ("disaggchunk", "mixed", "disaggregated, prefill chunks of 512 tokens"),
}

SHORT_MIN_CHARS, SHORT_MAX_CHARS = 600, 1200
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- inputs ---------------------------------------------------------------------------------------

def _stdlib_docstrings() -> list[tuple[str, str]]:
    """(module, docstring) of standard-library modules, read with ``ast`` from their source files
    (nothing is imported), sorted by name."""
    out = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in {"this", "antigravity"}:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None) if spec else None
        if not origin or not origin.endswith(".py"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8")))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc and len(doc.strip()) >= SHORT_MIN_CHARS:
            out.append((name, doc.strip()))
    return out


def _clip(text: str, limit: int = SHORT_MAX_CHARS) -> str:
    """``text`` cut after the last whole paragraph within ``limit`` characters (as
    tools/make_sample_data.py does)."""
    if len(text) <= limit:
        return text
    out = ""
    for p in text.split("\n\n"):
        if len(out) + len(p) + 2 > limit:
            break
        out = f"{out}\n\n{p}" if out else p
    return out or text[:limit]


def build_workloads(work: Path, rows: int, shards: int, long_frac: float, long_tokens: int,
                    max_model_len: int, max_new_tokens: int, tokenizer: Any) -> dict[str, dict]:
    """Write ``work/inputs/{uniform,mixed}/shard-NNNNN.parquet`` (``rows`` rows over ``shards``
    shards; columns ``id``, ``module``, ``kind`` (short/long), ``text``) and return per workload
    its directory and prompt-size facts.

    Short rows: distinct module docstrings clipped to <= 1200 characters (~150-350 tokens).
    Mixed: in each shard every ``1/long_frac``-th row (from row 1) is long: several full
    docstrings concatenated, starting at a different module for each long row (no shared
    prefix), cut to a length spread over [0.8, 1.2] x ``long_tokens`` tokens and capped so that
    prompt + ``max_new_tokens`` fits ``max_model_len``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _stdlib_docstrings()
    short = [(m, c) for m, c in ((m, _clip(d)) for m, d in docs) if len(c) >= 400]
    if len(short) < rows:
        raise SystemExit(f"only {len(short)} distinct short documents; use --rows <= {len(short)}")
    per = [rows // shards + (1 if i < rows % shards else 0) for i in range(shards)]
    every = max(1, round(1 / long_frac)) if long_frac > 0 else 0
    n_long = sum(sum(1 for r in range(n) if every and r % every == 1 % every) for n in per)
    cap = max_model_len - max_new_tokens - 64  # room for the template and the output
    full = [d for _, d in sorted(docs, key=lambda x: -len(x[1]))]
    longs = []
    for j in range(n_long):
        target = int(long_tokens * (0.8 + (0.4 * j / (n_long - 1) if n_long > 1 else 0.2)))
        target = min(target, cap)
        parts, k = [], j * 7
        while True:
            parts.append(full[k % len(full)])
            k += 1
            ids = tokenizer("\n\n".join(parts), add_special_tokens=False)["input_ids"]
            if len(ids) >= target:
                break
        longs.append((f"long{j}", tokenizer.decode(ids[:target])))
    out = {}
    for wl in ("uniform", "mixed"):
        d = work / "inputs" / wl
        d.mkdir(parents=True, exist_ok=True)
        si, li = 0, 0
        for s, n in enumerate(per):
            recs = []
            for r in range(n):
                if wl == "mixed" and every and r % every == 1 % every:
                    m, t = longs[li]
                    li += 1
                    kind = "long"
                else:
                    m, t = short[si]
                    si += 1
                    kind = "short"
                recs.append({"id": f"{wl}-{s}-{r}", "module": m, "kind": kind, "text": t})
            pq.write_table(pa.Table.from_pylist(recs), d / f"shard-{s:05d}.parquet")
        toks = [len(tokenizer(t, add_special_tokens=False)["input_ids"])
                for p in sorted(d.glob("*.parquet")) for t in pq.read_table(p).column("text").to_pylist()]
        out[wl] = {"dir": str(d), "rows": rows, "shards": shards, "text_tokens": toks,
                   "long_rows": li, "text_tokens_total": sum(toks)}
    return out


# -- sampling CPU use -----------------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _stat_times(text: str) -> tuple[str, int, float]:
    """(comm, ppid, utime + stime in seconds) from a /proc stat line."""
    lp, rp = text.index("("), text.rindex(")")
    comm = text[lp + 1:rp]
    f = text[rp + 2:].split()
    return comm, int(f[1]), (int(f[11]) + int(f[12])) / CLK_TCK


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    f = [int(x) for x in _read("/proc/stat").split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / CLK_TCK


def _psi_cpu_some() -> float:
    """Seconds since boot during which some runnable task waited for a CPU (/proc/pressure/cpu),
    or NaN where PSI is unavailable."""
    text = _read("/proc/pressure/cpu") or ""
    for ln in text.splitlines():
        if ln.startswith("some"):
            return int(ln.rsplit("total=", 1)[1]) / 1e6
    return float("nan")


class ProcSampler:
    """Samples, every ``interval`` seconds, for every process under ``root_pid`` and each of its
    threads: cumulative CPU time (``/proc/.../stat`` utime + stime), cumulative time spent
    runnable but waiting for a CPU (``/proc/.../schedstat``, field 2: run-queue delay) and the
    thread's allowed CPUs; plus the machine's busy time and CPU pressure (PSI)."""

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
            st = _read(f"/proc/{pid}/stat")
            if not st or pid == self.root or st.split(")")[-1].split()[19] != info.get("start"):
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
            st = _read(f"/proc/{name}/stat")
            if st:
                try:
                    kids.setdefault(_stat_times(st)[1], []).append(int(name))
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
        t, busy, psi = time.time(), _machine_busy(), _psi_cpu_some()
        procs: dict[int, float] = {}
        threads: dict[tuple[int, int], tuple[float, float]] = {}
        for pid in self._tree():
            st = _read(f"/proc/{pid}/stat")
            if not st:
                continue
            comm, ppid, cpu = _stat_times(st)
            procs[pid] = cpu
            if pid not in self.procs:
                self.procs[pid] = {"comm": comm, "ppid": ppid, "cmdline": (
                    _read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")[:200], "bind": None,
                    "start": st.split(")")[-1].split()[19]}
            info = self.procs[pid]
            if info["bind"] is None:
                env = _read(f"/proc/{pid}/environ") or ""
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
                tst = _read(f"{base}/stat")
                if not tst:
                    continue
                tcomm, _, tcpu = _stat_times(tst)
                sched = (_read(f"{base}/schedstat") or "0 0 0").split()
                threads[(pid, int(tid))] = (tcpu, int(sched[1]) / 1e9)
                status = _read(f"{base}/status") or ""
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


# -- metrics of a run -----------------------------------------------------------------------------

def _pct(values, q):
    import numpy as np

    v = np.asarray([x for x in values if x is not None], dtype=float)
    return float(np.percentile(v, q)) if v.size else None


def stall_attribution(cols: dict[str, list], stall_s: float) -> dict[str, Any]:
    """Each ITL gap > ``stall_s`` of a request, attributed to what overlapped it (see the module
    docstring): counts and the longest gap per cause."""
    n = len(cols["key"])
    engine = [cols["decode_worker"][i] or cols["prefill_worker"][i] for i in range(n)]
    first = [tt[0] if tt else None for tt in cols["token_times"]]
    local = []   # (engine, start, end, request index): prefill work on the engine that decodes
    remote = []  # (start, end, request index): prefill on a separate prefill worker
    for i in range(n):
        if first[i] is None:
            continue
        if cols["decode_worker"][i] is not None:
            if cols["decode_arrived_at"][i] is not None:
                local.append((engine[i], cols["decode_arrived_at"][i], first[i], i))
            if cols["prefill_start"][i] is not None and cols["prefill_end"][i] is not None:
                remote.append((cols["prefill_start"][i], cols["prefill_end"][i], i))
        elif cols["prefill_start"][i] is not None:
            local.append((engine[i], cols["prefill_start"][i], first[i], i))
    causes = {"prefill": [], "remote prefill": [], "none": []}
    for i, tt in enumerate(cols["token_times"]):
        for a, b in zip(tt or [], (tt or [])[1:]):
            if b - a <= stall_s:
                continue
            if any(e == engine[i] and j != i and s < b and f > a for e, s, f, j in local):
                causes["prefill"].append(b - a)
            elif any(j != i and s < b and f > a for s, f, j in remote):
                causes["remote prefill"].append(b - a)
            else:
                causes["none"].append(b - a)
    return {k: {"count": len(v), "max_s": max(v) if v else None} for k, v in causes.items()}


def handoff_parts(cols: dict[str, list], steps: dict[str, list] | None = None) -> dict[str, Any] | None:
    """Per disaggregated request: ``message`` = decode_arrived_at - prefill_end, ``transfer`` =
    token_times[0] - decode_arrived_at (KV transfer + decode scheduling + the 1-token step),
    ``total`` = their sum; p50/p99/max of each, and the first-arrived request's extra over the
    median (the one-time NIXL handshake estimate). With ``steps`` (the run's worker metrics
    columns), also NIXL's own telemetry of each KV transfer (``nixl_*``: seconds from post to
    completion, seconds to post, bytes, GB/s of each transfer; p50 over transfers)."""
    rows = []
    for pe, da, tt in zip(cols["prefill_end"], cols["decode_arrived_at"], cols["token_times"]):
        if pe is not None and da is not None and tt:
            rows.append((da, da - pe, tt[0] - da, tt[0] - pe))
    if not rows:
        return None
    rows.sort()
    out: dict[str, Any] = {"requests": len(rows)}
    for k, idx in (("message", 1), ("transfer", 2), ("total", 3)):
        vals = [r[idx] for r in rows]
        out[f"{k}_p50_s"] = _pct(vals, 50)
        out[f"{k}_p99_s"] = _pct(vals, 99)
        out[f"{k}_max_s"] = max(vals)
        out[f"{k}_first_s"] = rows[0][idx]
        out[f"{k}_first_extra_s"] = rows[0][idx] - statistics.median(vals)
    if steps is not None:
        xs = [(t, p, b) for ts, ps, bs in zip(steps["kv_transfer_s"], steps["kv_post_s"], steps["kv_transfer_bytes"])
              if ts for t, p, b in zip(ts, ps, bs)]
        if xs:
            out["nixl_transfers"] = len(xs)
            out["nixl_transfer_p50_s"] = _pct([x[0] for x in xs], 50)
            out["nixl_post_p50_s"] = _pct([x[1] for x in xs], 50)
            out["nixl_bytes_p50"] = _pct([x[2] for x in xs], 50)
            out["nixl_gbps_p50"] = _pct([x[2] / x[0] / 1e9 for x in xs if x[0] > 0], 50)
    return out


def per_owner_throughput(cols: dict[str, list]) -> dict[str, Any]:
    """Throughput with each shard owner's own engine start-up removed: the sum over owners
    (prefill or colocated workers) of its rows' output tokens / (its last token - its first
    ``read_at``). Equal to summarize_run's figure with one owner; with several colocated workers
    it drops the time one worker served alone while the other's engine was still starting.
    ``owner_start_skew_s``: latest minus earliest owner's first ``read_at``."""
    by: dict[str, list[int]] = {}
    for i, w in enumerate(cols["prefill_worker"]):
        by.setdefault(w, []).append(i)
    rate, starts = 0.0, []
    for idx in by.values():
        t0 = min(cols["read_at"][i] for i in idx)
        t1 = max(cols["token_times"][i][-1] for i in idx if cols["token_times"][i])
        rate += sum(cols["output_tokens"][i] or 0 for i in idx) / max(t1 - t0, 1e-9)
        starts.append(t0)
    return {"output_tokens_per_s_per_owner_sum": rate, "owner_start_skew_s": max(starts) - min(starts)}


def worker_steps(w: dict[str, list], t0: float, t1: float) -> dict[str, Any]:
    """Per worker: engine steps recorded, steps that computed no token, and steps per second of
    the window, from the run's worker metrics columns (RUN_DIR/metrics/workers)."""
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(w["worker"]):
        d = out.setdefault(name.split("@")[0], {"steps": 0, "idle_steps": 0, "steps_in_window": 0})
        d["steps"] += 1
        if not (w["prompt_tokens"][i] or w["generation_tokens"][i]):
            d["idle_steps"] += 1
        if t0 <= w["t"][i] <= t1:
            d["steps_in_window"] += 1
    for d in out.values():
        d["steps_per_s"] = d["steps_in_window"] / max(t1 - t0, 1e-9)
    return out


class RunError(RuntimeError):
    """A benchmarked run failed or timed out; the message names its log."""


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
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
        sampler = ProcSampler(proc.pid, args.sample_s).start()
        try:
            rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            _dump_stacks(sampler, Path(f"{log}.stacks"))
            proc.terminate()
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        sampler.stop()
    # vLLM's engine processes end shortly after their worker; give them 15 s, then kill what is
    # left (idle helpers such as multiprocessing's resource tracker are killed at once).
    deadline = time.time() + 15
    while time.time() < deadline and any(
            _read(f"/proc/{p}/stat") for p, i in sampler.procs.items() if p != sampler.root and i["bind"]):
        time.sleep(0.5)
    left = sampler.kill_leftovers()
    return rc, sampler, t_launch, [x for x in left if "VLLM" in x or "EngineCor" in x]


def _dump_stacks(sampler: ProcSampler, path: Path) -> None:
    spy = Path(sys.executable).with_name("py-spy")
    with open(path, "w") as f:
        for pid, info in sampler.procs.items():
            if not _read(f"/proc/{pid}/stat"):
                continue
            f.write(f"== pid {pid} {info['comm']} (ppid {info['ppid']}, cores {info['bind']}) "
                    f"wchan {_read(f'/proc/{pid}/wchan')}\n")
            f.flush()
            if spy.exists():
                subprocess.run([str(spy), "dump", "--pid", str(pid)], stdout=f, stderr=subprocess.STDOUT,
                               timeout=60, check=False)


def with_retry(fn, name: str, rep: int, failures: list[dict]):
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


# -- one run --------------------------------------------------------------------------------------

def _base_overrides(args: argparse.Namespace, input_dir: str) -> list[str]:
    return ["+job=summarize", f"job.input={input_dir}",
            f"job.sampling.max_new_tokens={args.max_new_tokens}", f"model.dtype={args.dtype}"]


def pipeline_overrides(name: str, args: argparse.Namespace, wl: dict) -> tuple[list[str], dict[str, str]]:
    """Hydra overrides of configuration ``name`` and its engines' roles by core list."""
    from pipeline.launch.local import cpu_slices

    base = _base_overrides(args, wl["dir"])
    if name == "coloc1":
        return base + ["pools=colocated", "pools.prefill=1", f"job.batch_rows={wl['rows']}"], \
            {cpu_slices(1, "partition")[0]: "colocated-0"}
    if name.startswith("coloc2"):
        c = cpu_slices(2, "partition")
        return base + ["pools=colocated", "pools.prefill=2",
                       f"job.batch_rows={max(1, args.inflight // 2)}"], \
            {c[0]: "colocated-0", c[1]: "colocated-1"}
    if name.startswith("disagg"):
        c = cpu_slices(2, "partition")
        spin = (["transport.nixl_progress_delay_us=0"] if name.startswith("disaggspin") else
                ["model.prefill_chunk_tokens=512"] if name.startswith("disaggchunk") else [])
        return base + ["pools=disaggregated", "pools.prefill=1", "pools.decode=1",
                       f"job.batch_rows={args.inflight}"] + spin, {c[0]: "prefill-0", c[1]: "decode-0"}
    raise ValueError(name)


def run_pipeline(name: str, rep: int, args: argparse.Namespace, wl: dict, work: Path) -> dict[str, Any]:
    from pipeline.metrics import read_request_metrics, read_worker_metrics
    from pipeline.report import summarize_run

    overrides, roles = pipeline_overrides(name, args, wl)
    run_dir = work / "runs" / f"{name}-r{rep}"
    cmd = [sys.executable, "-m", "pipeline", *overrides, f"run.dir={run_dir}",
           f"job.output={run_dir}/output", "run.progress=false", "run.report=false"]
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)  # a retried run starts afresh (not a resume)
    log = work / "runs" / f"{name}-r{rep}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = None
    load0 = os.getloadavg()[0]
    rc, sampler, t_launch, leftovers = run_sampled(cmd, log, args, env)
    t_end = time.time()
    if rc != 0:
        raise RunError(f"{name} repeat {rep}: exit status {rc}; log {log} and {run_dir}/logs:\n"
                       f"{log.read_text()[-1500:]}")
    rep_ = summarize_run(run_dir, args.stall_ms / 1e3)
    cols = read_request_metrics(run_dir).to_pydict()
    steps = read_worker_metrics(run_dir).to_pydict()
    t0 = min(x for x in cols["read_at"] if x is not None)
    p0 = min(x for x in cols["prefill_start"] if x is not None)
    t1 = max(tt[-1] for tt in cols["token_times"] if tt)
    labels = label_processes(sampler, roles)
    out = {
        "config": name, "repeat": rep, "run_dir": str(run_dir), "command": " ".join(cmd[1:]),
        "output_tokens": rep_["output_tokens"], "prompt_tokens": rep_["prompt_tokens"],
        "requests": rep_["requests"], "errors": rep_["errors"],
        "wall_s": rep_["wall_s"], "output_tokens_per_s": rep_["output_tokens_per_s"],
        "output_tokens_per_s_from_prefill_start": rep_["output_tokens"] / (t1 - p0),
        **per_owner_throughput(cols),
        "startup_s": t0 - t_launch, "process_s": t_end - t_launch,
        "stalls_by_cause": stall_attribution(cols, args.stall_ms / 1e3),
        "handoff": handoff_parts(cols, steps),
        "steps": worker_steps(steps, t0, t1),
        "cpu": sampler.window(t0, t1, labels),
        "loadavg_1m_before": load0, "leftover_processes_killed": leftovers,
        "itl_zero_gap_fraction": rep_["itl_zero_gaps"] / rep_["itl_gaps"] if rep_["itl_gaps"] else None,
    }
    for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "itl_max_s", "stalls",
              "requests_with_stalls", "kv_handoff_p50_s", "kv_handoff_p99_s", "kv_total_bytes",
              "mean_batch_size", "max_batch_size", "busy_fraction"):
        out[k] = rep_[k]
    out["tokens_by_row"] = _output_tokens_by_row(run_dir)
    return out


def _output_tokens_by_row(run_dir: Path) -> dict[str, list]:
    import pyarrow.parquet as pq

    out = {}
    for p in sorted((run_dir / "output").glob("*.parquet")):
        t = pq.read_table(p, columns=["id", "prompt_tokens", "generation_token_ids"]).to_pydict()
        for i, pt, g in zip(t["id"], t["prompt_tokens"], t["generation_token_ids"]):
            out[str(i)] = [pt, g]
    return out


def run_raw(rep: int, args: argparse.Namespace, wl: dict, work: Path) -> dict[str, Any]:
    """raw vLLM in a child process (``--_raw``), its process tree sampled like a pipeline run."""
    from pipeline.launch.local import cpu_slices

    cpus = cpu_slices(1, "partition")[0]
    spec = work / "runs" / f"raw-r{rep}.spec.json"
    res = work / "runs" / f"raw-r{rep}.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"overrides": _base_overrides(args, wl["dir"]), "cpus": cpus}))
    log = work / "runs" / f"raw-r{rep}.log"
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_raw", str(spec), str(res)]
    rc, sampler, _, leftovers = run_sampled(cmd, log, args)
    if rc != 0:
        raise RunError(f"raw repeat {rep}: exit status {rc}; log {log}:\n{log.read_text()[-1500:]}")
    r = json.loads(res.read_text())
    labels = label_processes(sampler, {cpus: "raw"})
    labels[sampler.root] = "raw front-end"
    r.update({"config": "raw", "repeat": rep, "leftover_processes_killed": leftovers, "cpu": sampler.window(r["t0"], r["t1"], labels),
              "loadavg_1m_before": load0})
    return r


def _raw_main(spec_path: str, out_path: str) -> None:
    """The raw vLLM child: compose the pipeline's config, render its prompts, time generate()."""
    spec = json.loads(Path(spec_path).read_text())
    from pipeline.config import compose
    from pipeline.data.output import row_ids
    from pipeline.data.prompts import make_prompts
    from pipeline.data.shards import list_shards, read_shard
    from pipeline.roles.engine import engine_env, load_tokenizer, model_path, parse_cpus, pin_descendants

    cfg = compose(spec["overrides"])
    os.environ.update(engine_env(cfg, cpus=spec["cpus"], side_channel=None))
    tok = load_tokenizer(cfg)
    prompts, ids = [], []
    for shard in list_shards(cfg.job.input):
        table = read_shard(shard)
        rid = row_ids(table, cfg.job.id_column, shard.name).to_pylist()
        keys = [f"{shard.index}:{i}" for i in range(table.num_rows)]
        for p, i in zip(make_prompts(table.column(cfg.job.text_column).to_pylist(), keys, cfg.job, tok,
                                     cfg.model.max_model_len, ids=rid), rid):
            if p.token_ids is not None:
                prompts.append(p.token_ids)
                ids.append(str(i))
    from vllm import LLM, SamplingParams

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    kw = {"block_size": cfg.model.block_size} if cfg.model.block_size else {}
    common = dict(model=model_path(cfg), dtype=cfg.model.dtype, max_model_len=cfg.model.max_model_len,
                  tensor_parallel_size=cfg.model.prefill_tp, gpu_memory_utilization=cfg.model.gpu_memory_utilization,
                  enforce_eager=cfg.model.enforce_eager, seed=0, disable_log_stats=True, **kw)
    # vLLM picks scheduler limits by usage context: the pipeline's AsyncLLM (ENGINE_CONTEXT) gets
    # max_num_batched_tokens 2048 / max_num_seqs 128 on CPU, LLM (LLM_CLASS) 4096 / 256. Give the
    # raw engine the pipeline's, as the pipeline's engine arguments resolve them.
    sched = AsyncEngineArgs(**common).create_engine_config(UsageContext.ENGINE_CONTEXT).scheduler_config
    ts = time.time()
    llm = LLM(max_num_batched_tokens=sched.max_num_batched_tokens, max_num_seqs=sched.max_num_seqs, **common)
    pin_descendants(parse_cpus(spec["cpus"]))
    s = cfg.job.sampling
    params = SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed)
    t0 = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    t1 = time.time()
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    Path(out_path).write_text(json.dumps({
        "t0": t0, "t1": t1, "startup_s": t0 - ts, "wall_s": t1 - t0, "output_tokens": n,
        "prompt_tokens": sum(len(p) for p in prompts), "requests": len(prompts),
        "output_tokens_per_s": n / (t1 - t0), "cpus": spec["cpus"],
        "max_num_batched_tokens": sched.max_num_batched_tokens, "max_num_seqs": sched.max_num_seqs,
        "tokens_by_row": {i: [len(p), list(o.outputs[0].token_ids)] for i, p, o in zip(ids, prompts, outs)},
    }))
    try:
        llm.llm_engine.engine_core.shutdown()  # ends the engine core process and its workers
    finally:
        os._exit(0)  # skip the interpreter-exit teardown


# -- tables ---------------------------------------------------------------------------------------

def med(runs: list[dict], key: str, sub: str | None = None):
    vals = []
    for r in runs:
        v = r.get(key) if sub is None else (r.get(key) or {}).get(sub)
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v * 1e3:.1f}"
    if unit == "s":
        return f"{v:.2f}"
    if unit == "x":
        return f"{v:.2f}x"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def _ratio(a, b):
    return b / a if a not in (None, 0) and b is not None else None


def _per_repeat(runs: list[dict], key: str) -> str:
    return ", ".join(_fmt(r.get(key)) for r in runs)


def table_raw_vs_coloc(res: dict[str, list[dict]]) -> tuple[str, dict]:
    raw, col = res.get("raw", []), res.get("coloc1", [])
    rows = [("output tok/s (median)", "output_tokens_per_s", ""),
            ("output tokens", "output_tokens", ""), ("prompt tokens", "prompt_tokens", ""),
            ("generation wall (s)", "wall_s", "s"), ("engine start-up (s, not counted)", "startup_s", "s")]
    lines = ["| metric | raw vLLM | pipeline colocated | pipeline / raw |", "|---|---|---|---|"]
    for label, key, unit in rows:
        a, b = med(raw, key), med(col, key)
        lines.append(f"| {label} | {_fmt(a, unit)} | {_fmt(b, unit)} | {_fmt(_ratio(a, b), 'x')} |")
    lines.append(f"| output tok/s per repeat | {_per_repeat(raw, 'output_tokens_per_s')} | "
                 f"{_per_repeat(col, 'output_tokens_per_s')} | |")
    b2 = med(col, "output_tokens_per_s_from_prefill_start")
    lines.append(f"| pipeline tok/s from first prefill_start | | {_fmt(b2)} | "
                 f"{_fmt(_ratio(med(raw, 'output_tokens_per_s'), b2), 'x')} |")
    lines.append(f"| machine's other load (cores, median) | {_fmt(med(raw, 'cpu', 'other_load_cores'), 's')} | "
                 f"{_fmt(med(col, 'cpu', 'other_load_cores'), 's')} | |")
    same = _same_tokens(raw, col)
    if same:
        lines.append(f"| rows with identical greedy output (repeat 1) | {same} | | |")
    return "\n".join(lines), {"ratio": _ratio(med(raw, "output_tokens_per_s"), med(col, "output_tokens_per_s")),
                              "ratio_prefill_start": _ratio(med(raw, "output_tokens_per_s"), b2)}


def _same_tokens(a: list[dict], b: list[dict]) -> str | None:
    if not a or not b:
        return None
    ta, tb = a[0].get("tokens_by_row") or {}, b[0].get("tokens_by_row") or {}
    keys = sorted(set(ta) & set(tb))
    if not keys:
        return None
    same_prompt = sum(ta[k][0] == tb[k][0] for k in keys)
    same_out = sum(ta[k][1] == tb[k][1] for k in keys)
    return f"{same_out}/{len(keys)} (prompt lengths equal: {same_prompt}/{len(keys)})"


PART2_ROWS = [
    ("output tok/s (summarize_run: first read_at to last token)", "output_tokens_per_s", ""),
    ("output tok/s, each owner's start-up removed (sum over owners)", "output_tokens_per_s_per_owner_sum", ""),
    ("owners' start skew (s)", "owner_start_skew_s", "s"),
    ("TTFT p50 (s)", "ttft_p50_s", "s"), ("TTFT p99 (s)", "ttft_p99_s", "s"),
    ("ITL p50 (ms)", "itl_p50_s", "ms"), ("ITL p99 (ms)", "itl_p99_s", "ms"),
    ("ITL max (ms)", "itl_max_s", "ms"),
    ("stalls > threshold", "stalls", ""), ("requests with stalls", "requests_with_stalls", ""),
    ("wall (s, first read to last token)", "wall_s", "s"), ("output tokens", "output_tokens", ""),
    ("engine start-up (s, not counted)", "startup_s", "s"),
]


def table_disagg_vs_coloc(res: dict[str, list[dict]], wl: str, base: str = "coloc2",
                          base_label: str = "colocated 2x1 core") -> tuple[str, dict]:
    """``base`` (default colocated) vs disaggregated on workload ``wl``."""
    col, dis = res.get(f"{base}-{wl}", []), res.get(f"disagg-{wl}", [])
    lines = [f"| metric | {base_label} | disaggregated 1P+1D | disagg / {base} |", "|---|---|---|---|"]
    for label, key, unit in PART2_ROWS:
        a, b = med(col, key), med(dis, key)
        lines.append(f"| {label} | {_fmt(a, unit)} | {_fmt(b, unit)} | {_fmt(_ratio(a, b), 'x')} |")
    for cause in ("prefill", "remote prefill", "none"):
        a = statistics.median([r["stalls_by_cause"][cause]["count"] for r in col]) if col else None
        b = statistics.median([r["stalls_by_cause"][cause]["count"] for r in dis]) if dis else None
        am = max((r["stalls_by_cause"][cause]["max_s"] or 0 for r in col), default=None)
        bm = max((r["stalls_by_cause"][cause]["max_s"] or 0 for r in dis), default=None)
        what = {"prefill": "stalls during another request's prefill (a)", "remote prefill":
                "stalls during only a remote prefill (b)", "none": "other stalls (c)"}[cause]
        lines.append(f"| {what}: median count; longest over repeats (ms) | "
                     f"{_fmt(a)}; {_fmt(am, 'ms')} | {_fmt(b)}; {_fmt(bm, 'ms')} | |")
    lines.append(f"| output tok/s per repeat (start-up removed) | "
                 f"{_per_repeat(col, 'output_tokens_per_s_per_owner_sum')} | "
                 f"{_per_repeat(dis, 'output_tokens_per_s_per_owner_sum')} | |")
    lines.append(f"| ITL max (ms) per repeat | {', '.join(_fmt(r['itl_max_s'], 'ms') for r in col)} | "
                 f"{', '.join(_fmt(r['itl_max_s'], 'ms') for r in dis)} | |")
    lines.append(f"| machine's other load (cores, median) | {_fmt(med(col, 'cpu', 'other_load_cores'), 's')} | "
                 f"{_fmt(med(dis, 'cpu', 'other_load_cores'), 's')} | |")
    lines += ["", "(a) the gap overlaps another request's prefill on the same engine (colocated: "
              "prefill_start to first token) or, disaggregated, another request's KV arrival and first "
              "step on the decode engine (decode_arrived_at to first token); (b) it overlaps only a "
              "prefill on the prefill worker, on the other core; (c) neither."]
    facts = {
        "tps_ratio": _ratio(med(col, "output_tokens_per_s_per_owner_sum"),
                            med(dis, "output_tokens_per_s_per_owner_sum")),
        "tps_ratio_summarize_run": _ratio(med(col, "output_tokens_per_s"), med(dis, "output_tokens_per_s")),
        "itl_max": (med(col, "itl_max_s"), med(dis, "itl_max_s")),
        "disagg_prefill_stalls": max((r["stalls_by_cause"]["prefill"]["count"] for r in dis), default=None),
        "disagg_prefill_stalls_max_s": max((r["stalls_by_cause"]["prefill"]["max_s"] or 0 for r in dis), default=None),
    }
    return "\n".join(lines), facts


def _nixl_cell(runs: list[dict]) -> str:
    runs = [r for r in runs if r["handoff"].get("nixl_transfers")]
    if not runs:
        return "-"
    m = lambda k: med(runs, "handoff", k)  # noqa: E731
    return (f"{_fmt(m('nixl_transfer_p50_s'), 'ms')}; {_fmt(m('nixl_post_p50_s'), 'ms')}; "
            f"{m('nixl_bytes_p50') / 2**20:.1f}; {m('nixl_gbps_p50'):.2f}")


def table_handoff(res: dict[str, list[dict]]) -> str:
    lines = ["| workload | requests | message p50 / p99 / max (ms) | KV transfer + scheduling p50 / p99 / max (ms) | "
             "of which NIXL transfer p50 (ms; post ms; MiB; GB/s) | "
             "total p50 / p99 (ms) | first request to arrive: transfer (ms); its extra over the median (ms) |",
             "|---|---|---|---|---|---|---|"]
    for wl in ("uniform", "mixed"):
        runs = [r for r in res.get(f"disagg-{wl}", []) if r.get("handoff")]
        if not runs:
            continue

        def m(k):
            return med(runs, "handoff", k)
        lines.append(
            f"| {wl} | {m('requests'):.0f} | {_fmt(m('message_p50_s'), 'ms')} / {_fmt(m('message_p99_s'), 'ms')} / "
            f"{_fmt(m('message_max_s'), 'ms')} | {_fmt(m('transfer_p50_s'), 'ms')} / {_fmt(m('transfer_p99_s'), 'ms')} / "
            f"{_fmt(m('transfer_max_s'), 'ms')} | {_nixl_cell(runs)} | {_fmt(m('total_p50_s'), 'ms')} / {_fmt(m('total_p99_s'), 'ms')} | "
            f"{_fmt(m('transfer_first_s'), 'ms')}; {_fmt(m('transfer_first_extra_s'), 'ms')} |")
    return "\n".join(lines)


def table_cpu(res: dict[str, list[dict]]) -> str:
    lines = ["| configuration | process | CPU (cores) | run-queue wait (threads waiting for a CPU) | "
             "engine steps (no token computed) | steps/s |", "|---|---|---|---|---|---|"]
    for name in CONFIGS:
        runs = res.get(name, [])
        if not runs:
            continue
        procs = sorted({p for r in runs for p in r["cpu"]["cores_by_process"]})
        for p in procs:
            v = statistics.median([r["cpu"]["cores_by_process"].get(p, 0.0) for r in runs])
            wq = statistics.median([r["cpu"].get("runqueue_wait_by_process", {}).get(p, 0.0) for r in runs])
            if v < 0.005 and wq < 0.005:
                continue
            worker = p.rsplit(" ", 2)[0] if p.endswith((" engine core", " model worker")) else p
            steps = rate = ""
            if p.endswith(" engine core") and any(worker in (r.get("steps") or {}) for r in runs):
                st = [r["steps"][worker] for r in runs if worker in r.get("steps", {})]
                steps = (f"{statistics.median([x['steps'] for x in st]):.0f} "
                         f"({statistics.median([x['idle_steps'] for x in st]):.0f})")
                rate = f"{statistics.median([x['steps_per_s'] for x in st]):.0f}"
            lines.append(f"| {name} | {p} | {v:.2f} | {wq:.2f} | {steps} | {rate} |")
        psi = med(runs, "cpu", "cpu_pressure_some")
        lines.append(f"| {name} | *machine: other processes' CPU; CPU pressure (PSI some)* | "
                     f"{med(runs, 'cpu', 'other_load_cores'):.2f} | {_fmt(psi, 's')} | | |")
    return "\n".join(lines)


def table_threads(res: dict[str, list[dict]], names: list[str]) -> str:
    lines = ["| configuration | process | thread (threads of that name) | allowed CPUs | CPU (cores) | "
             "run-queue wait |", "|---|---|---|---|---|---|"]
    for name in names:
        runs = res.get(name, [])
        if runs:
            for t in runs[0]["cpu"]["top_threads"][:8]:
                if t["cores"] >= 0.01 or t.get("runqueue_wait", 0) >= 0.05:
                    lines.append(f"| {name} | {t['process']} | `{t['thread']}` | {t.get('allowed_cpus', '?')} | "
                                 f"{t['cores']:.2f} | {t.get('runqueue_wait', 0):.2f} |")
    return "\n".join(lines)


def wait_quiet(max_wait_s: float, threshold: float) -> dict[str, float]:
    """Wait (at most ``max_wait_s``) until the machine's busy CPU over 3 s is below
    ``threshold`` cores (other work shares these cores). Returns the wait and the last level."""
    t0, level = time.time(), 0.0
    while True:
        b0, w0 = _machine_busy(), time.time()
        time.sleep(3)
        level = (_machine_busy() - b0) / (time.time() - w0)
        if level < threshold or time.time() - t0 >= max_wait_s:
            return {"waited_s": time.time() - t0, "busy_cores_before": level}


def machine_text() -> str:
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
    mem = (_read("/proc/meminfo") or "").split("\n", 1)[0]
    lines.append(f"memory: {mem.split(':', 1)[-1].strip()}; {platform.platform()}; Python {platform.python_version()}")
    try:
        import vllm  # noqa: F401 - version only
        from importlib.metadata import version
        lines.append(f"vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, nixl {version('nixl')}")
    except Exception:  # versions are informative only
        pass
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (default 3)")
    ap.add_argument("--rows", type=int, default=16, help="rows per workload (default 16)")
    ap.add_argument("--shards", type=int, default=2, help="shards per workload (default 2)")
    ap.add_argument("--inflight", type=int, default=8,
                    help="rows in flight in total for the disaggregated/colocated comparison (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="job.sampling.max_new_tokens (default 64)")
    ap.add_argument("--long-frac", type=float, default=0.25, help="fraction of long rows in 'mixed' (default 0.25)")
    ap.add_argument("--long-tokens", type=int, default=2500, help="mean text tokens of a long row (default 2500)")
    ap.add_argument("--dtype", default="bfloat16", help="model.dtype (default bfloat16)")
    ap.add_argument("--only", default="raw,coloc,disagg",
                    help="parts: raw, coloc (= coloc1 + coloc2), coloc1, coloc2, disagg, disaggspin "
                         "(disaggregated with NIXL's busy-polling progress thread, as before), disaggchunk (prefill "
                         "chunks of 512 tokens); the last two are not in the default")
    ap.add_argument("--workloads", default="uniform,mixed", help="for coloc2/disagg (default uniform,mixed)")
    ap.add_argument("--stall-ms", type=float, default=60.0, help="stall threshold (default 60)")
    ap.add_argument("--sample-s", type=float, default=1.0, help="CPU sampling interval (default 1 s)")
    ap.add_argument("--run-timeout", type=float, default=420.0, help="seconds one run may take")
    ap.add_argument("--quiet-wait-s", type=float, default=20.0,
                    help="before each run, wait up to this long for the machine to be quiet (default 20; 0: no)")
    ap.add_argument("--quiet-below", type=float, default=0.3,
                    help="quiet = less than this many cores busy over 3 s (default 0.3)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--work-dir", help="work directory (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--kv", action="store_true", help="also run tools/bench_kv.py (short setting)")
    ap.add_argument("--_raw", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._raw:
        _raw_main(*args._raw)
        return 0
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    bad = parts - {"raw", "coloc", "coloc1", "coloc2", "disagg", "disaggspin", "disaggchunk"}
    if bad:
        ap.error(f"--only: unknown part(s) {sorted(bad)}")
    wls = {w.strip() for w in args.workloads.split(",") if w.strip()}
    if wls - {"uniform", "mixed"}:
        ap.error("--workloads: uniform and/or mixed")
    if args.repeats < 1 or args.rows < args.shards or args.inflight < 2:
        ap.error("need --repeats >= 1, --rows >= --shards, --inflight >= 2")

    from pipeline.config import compose
    from pipeline.roles.engine import load_tokenizer

    cfg = compose(["+job=summarize", f"model.dtype={args.dtype}"])
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="pd-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    wl = build_workloads(work, args.rows, args.shards, args.long_frac, args.long_tokens,
                         cfg.model.max_model_len, args.max_new_tokens, load_tokenizer(cfg))
    names = [n for n, (part, w, _) in CONFIGS.items()
             if (part in parts or n.split("-")[0] in parts) and (n in ("raw", "coloc1") or w in wls)]
    print(f"work dir: {work}", file=sys.stderr)
    results: dict[str, list[dict]] = {n: [] for n in names}
    failures: list[dict] = []
    for rep in range(args.repeats):
        for n in names:
            w = wl[CONFIGS[n][1]]
            quiet = wait_quiet(args.quiet_wait_s, args.quiet_below) if args.quiet_wait_s > 0 else {}
            t = time.time()
            r = with_retry((lambda: run_raw(rep, args, w, work)) if n == "raw" else
                           (lambda: run_pipeline(n, rep, args, w, work)), n, rep, failures)
            if r is None:
                continue
            r.update(quiet)
            results[n].append(r)
            print(f"[{time.time() - t_start:6.0f} s] {n} repeat {rep + 1}/{args.repeats}: "
                  f"{r['output_tokens_per_s']:.1f} output tok/s ({r['output_tokens']} tokens), "
                  f"run {time.time() - t:.0f} s, other load {r['cpu']['other_load_cores']:.2f} cores, "
                  f"waited {quiet.get('waited_s', 0):.0f} s for <{args.quiet_below:g} busy cores "
                  f"(was {quiet.get('busy_cores_before', 0):.2f})"
                  + (f", killed leftovers {r['leftover_processes_killed']}" if r.get("leftover_processes_killed") else ""),
                  file=sys.stderr, flush=True)

    kv_text = None
    if args.kv:
        kv = subprocess.run([sys.executable, str(REPO / "tools" / "bench_kv.py"), "--sizes-mib", "4", "64",
                             "--repeats", "3", "--tls", "default", "--layouts", "whole,128"],
                            cwd=REPO, capture_output=True, text=True)
        kv_text = kv.stdout + (f"\n(exit status {kv.returncode}: {kv.stderr[-500:]})" if kv.returncode else "")

    out = [f"# pd-pipeline bench ({time.strftime('%Y-%m-%d %H:%M')}, {args.repeats} repeats, "
           f"{time.time() - t_start:.0f} s)", "", "```", machine_text(), "```", ""]
    u, m = wl["uniform"]["text_tokens"], wl["mixed"]["text_tokens"]
    out += [f"Model {cfg.model.name}, dtype {args.dtype}, enforce_eager {cfg.model.enforce_eager}, "
            f"max_model_len {cfg.model.max_model_len}, KV cache {cfg.model.kv_cache_gib:g} GiB per engine, "
            f"greedy, max_new_tokens {args.max_new_tokens}. Workloads: {args.rows} rows in {args.shards} shards; "
            f"uniform: document tokens {min(u)}-{max(u)} (median {statistics.median(u):.0f}); mixed: "
            f"{wl['mixed']['long_rows']} long rows of {min(x for x in m if x > 1000) if wl['mixed']['long_rows'] else 0}-{max(m)} "
            f"tokens, the rest as uniform. Rows in flight: part 1 all ({args.rows}); part 2 {args.inflight} "
            f"in total (colocated {max(1, args.inflight // 2)} per worker). Stall = ITL gap > {args.stall_ms:g} ms. "
            f"Medians over repeats; ratios of medians.", ""]
    facts: dict[str, Any] = {}
    if "raw" in results and "coloc1" in results:
        text, facts["raw"] = table_raw_vs_coloc(results)
        out += ["## 1. Pipeline colocated vs raw vLLM (uniform workload, all cores)", "", text, ""]
    for w in ("uniform", "mixed"):
        if f"coloc2-{w}" in results or f"disagg-{w}" in results:
            text, facts[w] = table_disagg_vs_coloc(results, w)
            out += [f"## 2{'a' if w == 'uniform' else 'b'}. Disaggregated vs colocated, same 2 cores: {w} workload",
                    "", text, ""]
    for w in ("uniform", "mixed"):
        if f"disaggchunk-{w}" in results and f"disagg-{w}" in results:
            text, _ = table_disagg_vs_coloc(results, w, "disaggchunk", "disaggregated, prefill chunks of 512 tokens")
            out += [f"## 2e. Prefill chunk: 512 tokens vs vLLM's default: {w} workload", "", text, ""]
        if f"disaggspin-{w}" in results and f"disagg-{w}" in results:
            text, _ = table_disagg_vs_coloc(results, w, "disaggspin", "disaggregated, NIXL progress thread spinning (before)")
            out += [f"## 2{'c' if w == 'uniform' else 'd'}. NIXL progress thread: spinning (before) vs "
                    f"sleeping in poll() (pipeline.kv.connector): {w} workload", "", text, ""]
    if any(k.startswith("disagg") for k in results):
        out += ["## 3. Hand-off overhead per request (disaggregated)", "", table_handoff(results), ""]
    out += ["## 4. CPU use during the measured window", "", table_cpu(results), "",
            "Busiest threads (repeat 1; CPU and run-queue wait in cores, i.e. seconds per second of the window):", "", table_threads(results, [n for n in names if n != "coloc1"]), ""]
    out += ["## Targets", "", targets_table(facts), ""]
    if failures:
        out += ["## Failed runs (retried once)", ""] + [
            f"- {f['config']} repeat {f['repeat'] + 1} attempt {f['attempt']}: "
            f"{f['error'].splitlines()[0]}" for f in failures] + [""]
    if kv_text is not None:
        out += ["## KV transfer microbenchmark (tools/bench_kv.py)", "", "```", kv_text.strip(), "```", ""]
    print("\n".join(out))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "workloads": wl, "results": results,
                                               "failures": failures,
                                               "facts": facts, "machine": machine_text()}, indent=1, default=str))
    if not args.keep and not args.work_dir:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


def targets_table(f: dict[str, Any]) -> str:
    lines = ["| target | measured | met |", "|---|---|---|"]

    def row(name, value, ok):
        lines.append(f"| {name} | {value} | {'-' if ok is None else ('yes' if ok else 'no')} |")
    if "raw" in f:
        r = f["raw"]["ratio"]
        row("pipeline colocated >= 0.95 x raw vLLM output tok/s",
            f"{_fmt(r, 'x')} (from read_at); {_fmt(f['raw']['ratio_prefill_start'], 'x')} (from prefill_start)",
            None if r is None else r >= 0.95)
    for w, goal in (("uniform", 0.85), ("mixed", 1.0)):
        if w in f:
            r = f[w]["tps_ratio"]
            row(f"disaggregated >= {goal} x colocated output tok/s ({w})",
                f"{_fmt(r, 'x')} (start-up removed); {_fmt(f[w]['tps_ratio_summarize_run'], 'x')} "
                f"(summarize_run)", None if r is None else r >= goal)
    if "mixed" in f:
        a, b = f["mixed"]["itl_max"]
        row("disaggregated ITL max < colocated (mixed)", f"{_fmt(b, 'ms')} ms vs {_fmt(a, 'ms')} ms",
            None if a is None or b is None else b < a)
        n = f["mixed"]["disagg_prefill_stalls"]
        row("no disaggregated stall > threshold overlapping another request's prefill (mixed, any repeat)",
            f"{n} (longest {_fmt(f['mixed']['disagg_prefill_stalls_max_s'], 'ms')} ms)", None if n is None else n == 0)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
