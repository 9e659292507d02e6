"""``tools/bench_scale.py engines`` (issue #39 section 1): how the pipeline's cost grows with rows
and shards, with engines, side by side against raw vLLM on the same prompts and cores.

For each ``--rows`` value and each ``--outputs`` value (``job.sampling.max_new_tokens``), raw
vLLM ``LLM.generate`` runs once (:func:`tools.bench_parts.e2e.runs.run_raw`: the pipeline's token
ids, engine settings and core binding), then for each ``--shards`` value the pipeline colocated
(``pools=colocated pools.prefill=1``, ``tools/bench.py``'s ``coloc1``) and 1P:1D
(``pools=disaggregated pools.prefill=1 pools.decode=1``, its ``disagg``) over the same rows cut
into that many shards (:func:`tools.bench_parts.e2e.runs.run_pipeline_config`). Rows are short:
one line of text each, the first line of a docstring of the Python standard library (PSF
License), distinct while there are enough, then again with a number in front; row ids do not
depend on the sharding, so every run is checked against the same raw run row by row.

Per run: wall time as a whole process (launch to exit) and the generate window (raw: around
``generate()``; the pipeline: first row read to last token, ``summarize_run``'s ``wall_s``),
rows/s of each and the ratio to raw's; CPU outside the engine (the processes the sampler of
``tools/bench.py`` does not label ``engine core`` / ``model worker``: launcher, worker
front-ends, their helpers; raw: its front-end, i.e. ``LLM``'s own Python) per row, and the
pipeline's less raw's (its own cost per row); peak RSS (``VmHWM``) of the launcher, the worker
front-ends and the engine processes; files and bytes in the run directory; ``python -m
pipeline.status`` and ``python -m pipeline.report`` (wall, peak RSS); the same pipeline command
again on the finished run directory (time to find everything done and exit); whether every
row's output token ids equal raw's.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.benchlib.procfs import read
from tools.benchlib.sampling import ProcSampler
from tools.benchlib.tables import md_table

#: Labels of :func:`tools.bench_parts.e2e.processes.label_processes` that are the engine's.
ENGINE_SUFFIXES = (" engine core", " model worker")
#: The pipeline configurations, by ``--only`` name: (tools/bench.py configuration, description).
PIPELINE = {"coloc": ("coloc1", "pipeline colocated (1 worker, all cores)"),
            "pd": ("disagg-uniform", "pipeline 1P:1D")}


# -- inputs ---------------------------------------------------------------------------------------
def docstring_first_lines(source: str, min_chars: int = 20) -> list[str]:
    """The first line of each docstring (module, class, function) in Python ``source``, in
    source order, those shorter than ``min_chars`` left out."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            line = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
            if len(line) >= min_chars:
                out.append(line)
    return out


def one_line_texts(n: int, pool: list[str] | None = None) -> list[str]:
    """``n`` one-line texts: distinct docstring first lines of the standard library's sources
    (``pool`` instead where given), then the same again as ``"2. line"``, ``"3. line"``, ..."""
    if pool is None:
        pool, seen = [], set()
        root = Path(sysconfig.get_paths()["stdlib"])
        for p in sorted(root.rglob("*.py")):
            if "site-packages" in p.parts or "dist-packages" in p.parts:
                continue
            try:
                lines = docstring_first_lines(p.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for ln in lines:
                if ln not in seen:
                    seen.add(ln)
                    pool.append(ln)
            if len(pool) >= n:
                break
    if not pool:
        raise ValueError("no docstring lines found")
    return [pool[i % len(pool)] if i < len(pool) else f"{i // len(pool) + 1}. {pool[i % len(pool)]}"
            for i in range(n)]


def split_rows(rows: int, shards: int) -> list[int]:
    """Rows per shard: ``rows`` cut into ``shards`` contiguous parts, sizes differing by at most 1."""
    if not 1 <= shards <= rows:
        raise ValueError(f"need 1 <= shards <= rows, got {shards} shards of {rows} rows")
    return [rows // shards + (1 if s < rows % shards else 0) for s in range(shards)]


def write_rows(d: Path, texts: list[str], shards: int) -> dict[str, Any]:
    """``d/part-NNNNN.parquet``: ``texts`` over ``shards`` shards, columns ``id`` (``row0000042``,
    whatever the sharding) and ``text``. Returns the workload as run_raw / run_pipeline_config
    take it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    i = 0
    for s, n in enumerate(split_rows(len(texts), shards)):
        pq.write_table(pa.table({"id": [f"row{k:07d}" for k in range(i, i + n)], "text": texts[i:i + n]}),
                       d / f"part-{s:05d}.parquet")
        i += n
    return {"dir": str(d), "rows": len(texts), "shards": shards}


# -- figures --------------------------------------------------------------------------------------
def cpu_split(cores_by_process: dict[str, float], span_s: float) -> dict[str, float]:
    """CPU seconds of a sampled window (``ProcSampler.window``'s cores per label x its span):
    the engine's (labels ending in :data:`ENGINE_SUFFIXES`) and the rest's."""
    eng = sum(v for k, v in cores_by_process.items() if k.endswith(ENGINE_SUFFIXES))
    rest = sum(v for k, v in cores_by_process.items() if not k.endswith(ENGINE_SUFFIXES))
    return {"engine_cpu_s": eng * span_s, "outside_engine_cpu_s": rest * span_s}


def compare_tokens(raw: dict[str, list], pipe: dict[str, list]) -> dict[str, int]:
    """Rows of ``raw`` whose output token ids ``pipe`` has the same (``{id: [prompt tokens,
    output ids]}`` both, as run_raw and run_pipeline_config give them); rows of either missing
    from the other; rows whose prompt lengths differ; the first 5 rows that differ (id, the first
    8 output ids of raw and of the pipeline)."""
    keys = set(raw) & set(pipe)
    differ = sorted(k for k in keys if raw[k][1] != pipe[k][1])
    return {"rows": len(raw), "same": len(keys) - len(differ), "missing": len(set(raw) ^ set(pipe)),
            "prompt_differs": sum(raw[k][0] != pipe[k][0] for k in keys),
            "first_differing": [[k, raw[k][1][:8], pipe[k][1][:8]] for k in differ[:5]]}


def same_text(c: dict[str, int] | None) -> str:
    if c is None:
        return "-"
    ok = c["same"] == c["rows"] and not c["missing"]
    return "yes" if ok else f"NO ({c['same']}/{c['rows']}, {c['missing']} missing)"


def peak_rss_mib(peaks: dict[int, int], labels: dict[int, str], root: int) -> dict[str, float | None]:
    """Peak RSS (MiB; ``VmHWM`` kB per pid) of the launcher (``root``), the largest worker
    front-end (or other non-engine process) and the largest engine process."""
    def mx(pids):
        vals = [peaks[p] for p in pids if p in peaks]
        return max(vals) / 1024 if vals else None
    return {"launcher": mx([root]),
            "worker": mx([p for p, lab in labels.items() if p != root and not lab.endswith(ENGINE_SUFFIXES)
                          and lab != "other"]) or mx([p for p, lab in labels.items() if lab == "other"]),
            "engine": mx([p for p, lab in labels.items() if lab.endswith(ENGINE_SUFFIXES)])}


class RssSampler(ProcSampler):
    """:class:`ProcSampler` that also keeps each process's ``VmHWM`` (peak RSS, kB) as last read."""

    made: list["RssSampler"] = []

    def __init__(self, root_pid: int, interval: float = 1.0):
        super().__init__(root_pid, interval)
        self.peaks: dict[int, int] = {}
        RssSampler.made.append(self)

    def sample(self) -> None:
        super().sample()
        for pid in list(self.procs):
            for ln in (read(f"/proc/{pid}/status") or "").splitlines():
                if ln.startswith("VmHWM:"):
                    self.peaks[pid] = max(self.peaks.get(pid, 0), int(ln.split()[1]))


@contextlib.contextmanager
def rss_sampling() -> Iterator[list[RssSampler]]:
    """While open, tools/bench.py's runs sample with :class:`RssSampler`; yields the samplers made."""
    from tools.bench_parts.e2e import processes

    RssSampler.made = []
    old = processes.ProcSampler
    processes.ProcSampler = RssSampler
    try:
        yield RssSampler.made
    finally:
        processes.ProcSampler = old


# -- one grid point -------------------------------------------------------------------------------
def _bench_args(args: argparse.Namespace, out: int, inflight: int) -> argparse.Namespace:
    """The namespace tools/bench.py's run functions read."""
    return argparse.Namespace(max_new_tokens=out, dtype=args.dtype, inflight=inflight, stall_ms=60.0,
                              sample_s=args.sample_s, run_timeout=args.run_timeout)


def _whole(s: RssSampler, labels: dict[int, str]) -> dict[str, Any]:
    w = s.window(s.samples[0][0], s.samples[-1][0], labels)
    return {"process_cpu": cpu_split(w["cores_by_process"], w["span_s"]), "sampled_s": w["span_s"]}


def run_raw_point(args, out: int, wl: dict, work: Path) -> dict[str, Any]:
    from pipeline.launch.local import cpu_slices
    from tools.bench_parts.e2e.processes import label_processes
    from tools.bench_parts.e2e.runs import run_raw

    with rss_sampling() as made:
        r = run_raw(0, _bench_args(args, out, wl["rows"]), wl, work)
    s = made[-1]
    # launch (the sampler starts as the child is spawned) to the end of its tree, as the pipeline's
    r["process_s"] = time.time() - s.samples[0][0]
    labels = label_processes(s, {cpu_slices(1, "partition")[0]: "raw"})
    labels[s.root] = "raw front-end"
    r.update(_whole(s, labels))
    r["window_cpu"] = cpu_split(r["cpu"]["cores_by_process"], r["cpu"]["span_s"])
    r["peak_rss_mib"] = peak_rss_mib(s.peaks, labels, s.root)
    r["peak_rss_mib"]["worker"] = r["peak_rss_mib"].pop("launcher")  # raw's one Python process
    return r


def run_pipeline_point(args, kind: str, out: int, wl: dict, inflight: int, work: Path,
                       env: dict[str, str]) -> dict[str, Any]:
    from tools.bench_parts.e2e.configs import pipeline_overrides
    from tools.bench_parts.e2e.processes import label_processes
    from tools.bench_parts.e2e.runs import run_pipeline_config
    from tools.bench_scale import ROOT, count_files, timed_child
    from tools.benchlib.procs import pipeline_command

    name = PIPELINE[kind][0]
    bargs = _bench_args(args, out, inflight)
    wl_run = dict(wl, rows=inflight)  # coloc1's job.batch_rows is the workload's rows
    with rss_sampling() as made:
        r = run_pipeline_config(name, 0, bargs, wl_run, work)
    s = made[-1]
    overrides, roles = pipeline_overrides(name, bargs, wl_run)
    labels = label_processes(s, roles)
    r.update(_whole(s, labels))
    r["window_cpu"] = cpu_split(r["cpu"]["cores_by_process"], r["cpu"]["span_s"])
    r["peak_rss_mib"] = peak_rss_mib(s.peaks, labels, s.root)
    run_dir = Path(r["run_dir"])
    counts = count_files(run_dir)
    r["run_dir_files"] = sum(n for n, _ in counts.values())
    r["run_dir_bytes"] = sum(b for _, b in counts.values())
    r["run_dir_by_entry"] = counts
    py = sys.executable
    st = timed_child([py, "-m", "pipeline.status", str(run_dir)], env, ROOT)
    rep = timed_child([py, "-m", "pipeline.report", str(run_dir), "--out", str(work / f"report-{kind}")], env, ROOT)
    cmd = pipeline_command(*overrides, f"run.dir={run_dir}", f"job.output={run_dir}/output",
                           "run.progress=false", "run.report=false")
    again = timed_child(cmd, env, ROOT)
    for what, m in (("status", st), ("report", rep), ("rerun", again)):
        r[what] = {k: v for k, v in m.items() if k not in ("stdout", "stderr")}
        if m["rc"] != 0:
            r[what]["error"] = (m["stdout"][-800:] + m["stderr"][-1500:])
    r["rerun"]["nothing_to_do"] = "nothing to do" in again["stdout"]
    return r


def grid(args: argparse.Namespace, work: Path, env: dict[str, str], log=print,
         on_point=lambda points: None) -> dict[str, Any]:
    """Every run of the grid (see the module docstring), in order; raw once per rows x outputs.
    ``on_point(points)`` after each run (the figures so far)."""
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer
    from tools.benchlib.procfs import wait_quiet

    only = set(args.only)
    points: list[dict[str, Any]] = []
    t_start = time.time()
    cfg = compose(["+job=summarize", f"model.dtype={args.dtype}"])
    tok = load_tokenizer(cfg)
    for rows in args.rows:
        texts = one_line_texts(rows)
        text_tokens = [len(x) for x in tok(texts, add_special_tokens=False)["input_ids"]]
        inputs = {sh: write_rows(work / "inputs" / f"rows{rows}-shards{sh}", texts, sh)
                  for sh in args.shards if sh <= rows}
        for out in args.outputs:
            inflight = args.inflight or rows
            raw = None
            for sh in args.shards:
                if sh > rows:
                    log(f"skipped: {sh} shards > {rows} rows")
                    continue
                here = work / f"rows{rows}-out{out}-shards{sh}"
                kinds = (["raw"] if raw is None and "raw" in only else []) + [k for k in ("coloc", "pd") if k in only]
                for kind in kinds:
                    if args.quiet_wait_s > 0:
                        wait_quiet(args.quiet_wait_s, 0.3)
                    t = time.time()
                    base = {"kind": kind, "rows": rows, "outputs": out, "shards": sh if kind != "raw" else None,
                            "inflight": inflight, "text_tokens_total": sum(text_tokens)}
                    try:
                        r = (run_raw_point(args, out, inputs[sh], here) if kind == "raw"
                             else run_pipeline_point(args, kind, out, inputs[sh], inflight, here, env))
                    except Exception as exc:  # noqa: BLE001 - a failed run is listed, the grid goes on
                        points.append({**base, "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"})
                        log(f"[{time.time() - t_start:6.0f} s] {kind} rows {rows} out {out} shards {sh}: FAILED {exc}")
                        continue
                    r.update(base)
                    if kind == "raw":
                        raw = r
                    else:
                        if raw is not None:
                            r["same_tokens"] = compare_tokens(raw["tokens_by_row"], r["tokens_by_row"])
                        r.pop("tokens_by_row", None)
                    if kind != "raw" and not args.keep:
                        shutil.rmtree(r["run_dir"], ignore_errors=True)
                    points.append(r)
                    on_point(points)
                    log(f"[{time.time() - t_start:6.0f} s] {kind} rows {rows} out {out} shards {sh}: "
                        f"process {r['process_s']:.1f} s, generate {r['wall_s']:.1f} s, run {time.time() - t:.0f} s")
            if raw is not None:
                raw.pop("tokens_by_row", None)
                for p in points:
                    if p.get("kind") != "raw" and p["rows"] == rows and p["outputs"] == out:
                        p["raw_ref"] = {"process_s": raw["process_s"], "wall_s": raw["wall_s"],
                                        "outside_engine_cpu_s": raw["window_cpu"]["outside_engine_cpu_s"],
                                        "process_outside_engine_cpu_s": raw["process_cpu"]["outside_engine_cpu_s"]}
    return {"points": points, "elapsed_s": time.time() - t_start}


# -- tables ---------------------------------------------------------------------------------------
def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def derived(p: dict[str, Any]) -> dict[str, float | None]:
    """Rows/s (whole process, generate window), ratios to raw, CPU outside the engine per row
    (ms; generate window and whole process) and the pipeline's less raw's."""
    rows, ref = p["rows"], p.get("raw_ref")
    d: dict[str, float | None] = {
        "rows_per_s_process": rows / p["process_s"], "rows_per_s_window": rows / p["wall_s"],
        "outside_ms_per_row_window": 1e3 * p["window_cpu"]["outside_engine_cpu_s"] / rows,
        "outside_ms_per_row_process": 1e3 * p["process_cpu"]["outside_engine_cpu_s"] / rows,
        "ratio_process": None, "ratio_window": None, "own_ms_per_row_window": None, "own_ms_per_row_process": None}
    if ref:
        d["ratio_process"] = ref["process_s"] / p["process_s"]
        d["ratio_window"] = ref["wall_s"] / p["wall_s"]
        d["own_ms_per_row_window"] = 1e3 * (p["window_cpu"]["outside_engine_cpu_s"]
                                            - ref["outside_engine_cpu_s"]) / rows
        d["own_ms_per_row_process"] = 1e3 * (p["process_cpu"]["outside_engine_cpu_s"]
                                             - ref["process_outside_engine_cpu_s"]) / rows
    return d


def tables(points: list[dict[str, Any]]) -> str:
    """Throughput and CPU per run; then the pipeline runs' footprint (memory, files, status,
    report, rerun)."""
    ok = [p for p in points if "error" not in p]
    name = {"raw": "raw vLLM", "coloc": "colocated", "pd": "1P:1D"}
    t1, t2 = [], []
    for p in ok:
        d = derived(p)
        sh = "-" if p["kind"] == "raw" else p["shards"]
        t1.append([p["rows"], p["outputs"], sh, name[p["kind"]], _f(p["process_s"], ".1f"), _f(p["wall_s"], ".1f"),
                   _f(d["rows_per_s_process"], ".1f"), _f(d["rows_per_s_window"], ".1f"),
                   "" if p["kind"] == "raw" else _x(d["ratio_process"]),
                   "" if p["kind"] == "raw" else _x(d["ratio_window"]),
                   _f(d["outside_ms_per_row_window"], ".2f"), _f(d["outside_ms_per_row_process"], ".2f"),
                   "" if p["kind"] == "raw" else _f(d["own_ms_per_row_window"], ".2f"),
                   "" if p["kind"] == "raw" else same_text(p.get("same_tokens")),
                   _f(p["cpu"].get("other_load_cores"), ".2f")])
        if p["kind"] != "raw":
            m = p["peak_rss_mib"]
            t2.append([p["rows"], p["outputs"], p["shards"], name[p["kind"]], _f(m["launcher"], ".0f"),
                       _f(m["worker"], ".0f"), _f(m["engine"], ".0f"), p["run_dir_files"],
                       _f(p["run_dir_bytes"] / 2**20, ".2f"), _f(p["status"]["wall_s"], ".2f"),
                       _f(p["report"]["wall_s"], ".2f"), _f(p["report"]["peak_rss_mib"], ".0f"),
                       _f(p["rerun"]["wall_s"], ".2f") + ("" if p["rerun"].get("nothing_to_do") else " (!)")])
    text = md_table(["rows", "out tok", "shards", "run", "process s", "generate s", "rows/s process",
                     "rows/s generate", "/ raw process", "/ raw generate", "CPU outside engine ms/row (generate)",
                     "CPU outside engine ms/row (whole process)", "pipeline's own ms/row (generate, less raw's)",
                     "same tokens",
                     "other load (cores)"], t1, "rrrlrrrrrrrrrlr")
    if t2:
        text += "\n\n" + md_table(["rows", "out tok", "shards", "run", "launcher peak RSS MiB",
                                   "worker peak RSS MiB", "engine peak RSS MiB", "run dir files", "run dir MiB",
                                   "status s", "report s", "report peak RSS MiB", "rerun s (all done)"],
                                  t2, "rrrlrrrrrrrrr")
    bad = [p for p in points if "error" in p]
    if bad:
        text += "\n\nFailed runs:\n" + "\n".join(
            f"- {p['kind']} rows {p['rows']} out {p['outputs']} shards {p['shards']}: {p['error'].splitlines()[0]}"
            for p in bad)
    errs = [f"- {p['kind']} rows {p['rows']} out {p['outputs']} shards {p['shards']} {w}: exit {p[w]['rc']}"
            for p in ok if p["kind"] != "raw" for w in ("status", "report", "rerun") if p[w]["rc"] != 0]
    if errs:
        text += "\n\nFailed commands:\n" + "\n".join(errs)
    return text


def marginal(points: list[dict[str, Any]]) -> str:
    """Per run kind, outputs and shards, between the smallest and largest row count: the
    pipeline's extra seconds and CPU outside the engine per extra row (start-up cancels out)."""
    def cpu(p):
        return p["process_cpu"]["outside_engine_cpu_s"]
    rows = []
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        if "error" not in p:
            groups.setdefault((p["kind"], p["outputs"], p["shards"]), []).append(p)
    for (kind, out, sh), ps in groups.items():
        ps = sorted(ps, key=lambda p: p["rows"])
        if len(ps) < 2 or ps[0]["rows"] == ps[-1]["rows"]:
            continue
        a, b = ps[0], ps[-1]
        n = b["rows"] - a["rows"]
        rows.append([kind, out, "-" if sh is None else sh, f"{a['rows']}->{b['rows']}",
                     f"{1e3 * (b['process_s'] - a['process_s']) / n:.2f}",
                     f"{1e3 * (b['wall_s'] - a['wall_s']) / n:.2f}",
                     f"{1e3 * (cpu(b) - cpu(a)) / n:.2f}"])
    if not rows:
        return ""
    return md_table(["run", "out tok", "shards", "rows", "process ms per extra row", "generate ms per extra row",
                     "CPU outside engine ms per extra row (whole process)"], rows, "lrrlrrr")


def settings(args: argparse.Namespace, points: list[dict[str, Any]]) -> str:
    tok = {p["rows"]: p["text_tokens_total"] for p in points}
    return (f"Short rows: one line of text each (standard-library docstring first lines), document tokens "
            f"{', '.join(f'{r} rows: {t}' for r, t in sorted(tok.items()))}; prompt template of job=summarize; "
            f"greedy; dtype {args.dtype}; rows in flight {args.inflight or 'all'} (job.batch_rows; raw: one "
            f"generate() call). One run each. Ratio = raw's time / the pipeline's (rows/s pipeline / rows/s raw). "
            f"CPU outside the engine: every sampled process but vLLM's engine core and model worker processes "
            f"(pipeline: launcher, worker front-ends with AsyncLLM's output handling, helpers; raw: LLM's process); "
            f"'own' is the pipeline's less raw's in each one's generate window (the pipeline's includes reading "
            f"shards and tokenizing, which raw does before its window).")


def main(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Run the grid; print the tables; return the figures (for --json)."""
    import tempfile

    from tools.benchlib.machine import machine_text

    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="pd-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}", file=sys.stderr, flush=True)

    def save(points):  # every figure so far: a long grid that fails later keeps them
        if args.json:
            from tools.benchlib.results import write_json
            write_json(args.json, {"engines": {"args": vars(args), "partial": True,
                                                 "points": [{k: v for k, v in p.items() if k != "tokens_by_row"}
                                                            for p in points]}})

    res = grid(args, work, env, log=lambda m: print(m, file=sys.stderr, flush=True), on_point=save)
    pts = res["points"]
    print(f"# bench_scale engines ({time.strftime('%Y-%m-%d %H:%M')}, {res['elapsed_s']:.0f} s)\n")
    print(settings(args, pts) + "\n")
    print(tables(pts))
    m = marginal(pts)
    if m:
        print("\nPer extra row, between the smallest and largest row count:\n\n" + m)
    print("\n" + machine_text())
    if not args.keep and not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return {"engines": {"args": {k: v for k, v in vars(args).items() if k != "func"}, **res,
                        "machine": machine_text()}}


def add_parser(sub) -> argparse.ArgumentParser:
    from tools.benchlib.cli import csv_list

    def ints(text: str) -> list[int]:
        return [int(x) for x in csv_list(text)]

    e = sub.add_parser("engines", help="the pipeline (colocated, 1P:1D) against raw vLLM over rows x outputs x shards")
    e.add_argument("--rows", type=ints, default=[1000], help="comma list of row counts (default 1000)")
    e.add_argument("--outputs", type=ints, default=[1], help="comma list of max_new_tokens (default 1)")
    e.add_argument("--shards", type=ints, default=[10], help="comma list of shard counts (default 10)")
    e.add_argument("--only", type=csv_list, default=["raw", "coloc", "pd"], help="raw, coloc, pd (default all)")
    e.add_argument("--inflight", type=int, default=0,
                   help="job.batch_rows (rows in flight per prefill/colocated worker; default 0: all rows, "
                        "as raw's one generate() call)")
    e.add_argument("--dtype", default="bfloat16")
    e.add_argument("--sample-s", type=float, default=0.5, help="CPU/RSS sampling interval (default 0.5 s)")
    e.add_argument("--run-timeout", type=float, default=7200.0, help="seconds one run may take")
    e.add_argument("--quiet-wait-s", type=float, default=20.0,
                   help="before each run, wait up to this long for the machine to be quiet (default 20; 0: no)")
    e.add_argument("--work-dir", help="work directory (default: a new temporary one, removed at the end)")
    e.add_argument("--keep", action="store_true", help="keep every run directory")
    e.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return e


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    bad = set(args.only) - {"raw", "coloc", "pd"}
    if bad:
        ap.error(f"--only: unknown {sorted(bad)} (raw, coloc, pd)")
    if not args.rows or not args.outputs or not args.shards or min(args.rows + args.outputs + args.shards) < 1:
        ap.error("--rows, --outputs, --shards: positive integers")
    if os.cpu_count() and "pd" in args.only and len(os.sched_getaffinity(0)) < 2:
        ap.error("pd needs at least 2 cores")
