"""What the pipeline's own bookkeeping costs at scale, without engines (issue #39 sections 1-2):
work claims, ``status`` and the report over a million request records, the run directory's growth.

Four sub-commands, each printing Markdown and the machine::

    .venv/bin/python tools/bench_scale.py claims  [--units 10000] [--claimants 32] [--repeats 1]
    .venv/bin/python tools/bench_scale.py records [--records 1000000] [--shards 1000] [--prefill 8]
                                                  [--decode 8] [--tokens 32] [--repeats 3]
    .venv/bin/python tools/bench_scale.py checkpoints [--rows 2000] [--every 4,64] [--interval 0,2] [--rate 50]
    .venv/bin/python tools/bench_scale.py growth  [RUN_DIR ...]
    .venv/bin/python tools/bench_scale.py steps   [--hours 10] [--steps-per-s 20] [--merge 16,0]
    .venv/bin/python tools/bench_scale.py engines [--rows 1000,10000] [--outputs 1,32] [--shards 10]
                                                  [--only raw,coloc,pd] [--json FILE]

- **claims**: a run directory of ``--units`` shards (one unit each; the shards are never read),
  and ``--claimants`` processes (forked, no engines) that each do what a prefill or colocated
  worker's loop does (:mod:`pipeline.roles.work`): beat, claim the next unit with the real claim
  code (:mod:`pipeline.runtime.claims`), check it still holds it and mark it done, until none is
  left. Wall time from the common start to the last claimant's end, the claimants' CPU time, and
  the check that every unit was taken exactly once (each in one claimant's list, one done
  marker, one claim generation).
- **records**: a run directory *synthesized* in the files and formats the workers write
  (``shards.json``, claims, heartbeats, progress, engines, decode endpoints, done markers, output
  shards, per-request metrics parts of ``job.checkpoint_rows`` rows each as the shard owners
  write them with every checkpoint batch, per-worker step metrics parts every
  ``FLUSH_EVERY_S``, ``summary.json``) holding ``--records`` request records over ``--shards``
  shards and ``--prefill`` + ``--decode`` workers; no engine ran. Then ``python -m
  pipeline.status RUN_DIR`` and ``python -m pipeline.report RUN_DIR`` are timed, each under
  ``/usr/bin/time -v`` for its own peak RSS.
- **checkpoints**: a shard owner's row checkpoints and request metrics per row (no engine):
  rows through the real :class:`~pipeline.io.checkpoint.RowCheckpoint` at each
  ``job.checkpoint_rows``.
- **growth**: the files of each kind in run directories (a real run's, or one made by
  ``records``), and what each kind grows with.
- **steps**: one worker's engine-step metrics over ``--hours`` of run time, through the real
  :class:`~pipeline.engine.steps.StepRecorder` fed vLLM's own stats objects (``--steps-per-s``
  steps a second, a part flushed every ``FLUSH_EVERY_S`` of simulated time): its files at the
  end, the recorder's CPU time (writes and merges), and reading them back
  (:func:`~pipeline.io.metrics.read_worker_metrics`), for each ``MERGE_PARTS`` of ``--merge``
  (0: no merging, as before).
- **engines** (with engines, :mod:`tools.bench_parts.scale_engines`): for each rows x outputs x
  shards, raw vLLM, the pipeline colocated and 1P:1D on the same one-line rows and cores: wall
  and rows/s against raw, CPU per row outside the engine, peak RSS, run-directory files, status,
  report, a rerun's time to find everything done, and the output token ids against raw's.

``--code DIR`` runs ``claims`` and ``records``' commands against the ``pipeline`` package in
``DIR`` (an export of another commit, e.g. ``git archive bc94b59 pipeline | tar -x -C DIR``), for
before/after figures with the same command.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.machine import machine_text  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

T0 = 1_800_000_000.0  # epoch seconds of the synthesized run's launch


def _use_code(code: str | None) -> dict[str, str]:
    """Import ``pipeline`` from ``code`` (None: this checkout); the environment for children."""
    env = dict(os.environ)
    if code:
        sys.path.insert(0, str(Path(code).resolve()))
        env["PYTHONPATH"] = str(Path(code).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# -- claims ---------------------------------------------------------------------------------------
def make_claims_run(path: Path, units: int) -> None:
    """A run directory of ``units`` one-unit shards (never read: no input files)."""
    from pipeline.config import compose
    from pipeline.io.shards import Shard
    from pipeline.runtime.rundir import RunDir

    shards = [Shard(index=i, url=str(path / "in" / f"part-{i:05d}.parquet"), name=f"part-{i:05d}.parquet")
              for i in range(units)]
    RunDir(path / "run").create(compose(["+job=summarize", "pools=colocated"]), shards, str(path / "out"),
                                rows=units)


def _claimant(run_path: str, worker: str, go, out: str) -> None:
    """One claimant: a worker's loop of :mod:`pipeline.roles.work` with serving left out."""
    import pipeline.roles.work as work
    from pipeline.runtime.claims import Claims
    from pipeline.runtime.rundir import RunDir

    run = RunDir(run_path)
    claims = Claims(run_path, worker).start_heartbeat()
    go.wait()
    units = run.units()
    shards = {s.index: s for s in run.shards()}
    started: set[int] = set()
    taken: list[int] = []
    next_unit = getattr(work, "next_unit", None)
    while True:
        if next_unit is not None:
            i = next_unit(run, claims, units, shards, None, started)
        else:  # the loop before next_unit existed (pipeline/roles/work.py at bc94b59)
            i = claims.claim_next(range(len(units)), work.settled_units(run, units), None, started)
        if i is None:
            break
        started.add(i)
        taken.append(i)
        # What a ShardOwner reads of the run directory per unit, besides its input and output.
        run.sample_lists(), run.output_dir(), run.checkpoint_dir(shards[units[i].shard])
        if claims.holds(i):  # ShardOwner.own: still_mine before marking done
            now = time.time()
            run.mark_done(shards[units[i].shard], {"rows": 1, "errors": 0, "prompt_tokens": 1, "output_tokens": 1,
                                                   "kv_bytes": 0, "worker": worker, "resumed_rows": 0,
                                                   "started_at": now, "finished_at": now})
    claims.stop_heartbeat()
    Path(out).write_text(json.dumps({"worker": worker, "taken": taken, "end": time.time()}))


def bench_claims(units: int, claimants: int, work_dir: Path) -> dict:
    import multiprocessing as mp

    import pipeline.roles.work  # noqa: F401 - imported once, before the fork
    from pipeline.runtime.claims import holders
    from pipeline.runtime.rundir import RunDir

    make_claims_run(work_dir, units)
    run_path = work_dir / "run"
    ctx = mp.get_context("fork")
    go = ctx.Event()
    outs = [work_dir / f"claimant-{k}.json" for k in range(claimants)]
    procs = [ctx.Process(target=_claimant, args=(str(run_path), f"colocated-{k}@bench", go, str(outs[k])))
             for k in range(claimants)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # every claimant started and beating
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    go.set()
    for p in procs:
        p.join()
    wall = time.time() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if any(p.exitcode for p in procs):
        raise SystemExit(f"claimants failed: exit codes {[p.exitcode for p in procs]}")
    taken = [i for o in outs for i in json.loads(o.read_text())["taken"]]
    done = RunDir(run_path).done()
    held = holders(run_path)
    once = (sorted(taken) == list(range(units)) and len(done) == units
            and sorted(held) == list(range(units)) and all(g == 0 for g, _ in held.values()))
    per = sorted(len(json.loads(o.read_text())["taken"]) for o in outs)
    return {"units": units, "claimants": claimants, "wall_s": wall,
            "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
            "each_once": once, "taken": len(taken), "done_markers": len(done),
            "units_per_claimant_min_max": [per[0], per[-1]]}


# -- records --------------------------------------------------------------------------------------
def synthesize(run_path: Path, records: int, shards: int, prefill: int, decode: int, tokens: int,
               checkpoint_rows: int, batch_rows: int = 16, rows_per_s: float = 200.0, seed: int = 0) -> dict:
    """Write a finished run directory at ``run_path`` (see the module docstring); returns its
    figures. Disaggregated when ``decode`` > 0, else colocated (``prefill`` colocated workers)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.config import compose
    from pipeline.engine.steps import FLUSH_EVERY_S
    from pipeline.io.atomic import write_json
    from pipeline.io.metrics import REQUEST_SCHEMA, WORKER_SCHEMA
    from pipeline.io.output import output_schema
    from pipeline.io.shards import Shard
    from pipeline.runtime.rundir import RunDir

    rng = np.random.default_rng(seed)
    disagg = decode > 0
    role = "prefill" if disagg else "colocated"
    pws = [f"{role}-{k}@node{k}" for k in range(prefill)]
    dws = [f"decode-{k}@node{prefill + k}" for k in range(decode)]
    per_shard = [records // shards + (1 if s < records % shards else 0) for s in range(shards)]
    shard_list = [Shard(index=s, url=str(run_path.parent / "input" / f"part-{s:05d}.parquet"),
                        name=f"part-{s:05d}.parquet") for s in range(shards)]
    out_dir = run_path.parent / "output"
    run = RunDir(run_path)
    cfg = compose(["+job=summarize", f"pools={'disaggregated' if disagg else 'colocated'}",
                   f"job.checkpoint_rows={checkpoint_rows}", f"job.batch_rows={batch_rows}"])
    run.create(cfg, shard_list, str(out_dir), rows=records)
    os.utime(run_path / "shards.json", (T0, T0))
    claims = run_path / "claims"
    (claims / "workers").mkdir(parents=True, exist_ok=True)
    out_schema = output_schema(pa.schema([("id", pa.string()), ("text", pa.string())]), "id", "text")
    # Each prefill worker serves its shards one after another, rows_per_s / prefill rows/s each.
    worker_rate = rows_per_s / prefill
    clock = {w: T0 + 20.0 for w in pws}  # engines ready 20 s after launch
    rows_by = {w: 0 for w in pws}
    tokens_by = {w: 0 for w in pws}
    shards_by = {w: 0 for w in pws}
    metric_files = 0
    for s, n in enumerate(per_shard):
        w = pws[s % prefill]
        start = clock[w]
        dur = n / worker_rate
        clock[w] = start + dur
        row = np.arange(n, dtype=np.int64)
        read_at = start + np.floor(row / 1024) * (1024 / worker_rate)
        ps = start + row / worker_rate + rng.uniform(0.0, 0.02, n)
        pe = ps + rng.uniform(0.01, 0.05, n)
        first = (pe if disagg else ps) + rng.uniform(0.01, 0.03, n)
        itl = rng.uniform(0.02, 0.04, (n, tokens))
        itl[:, 0] = 0.0
        tt = (first[:, None] + np.cumsum(itl, axis=1)).ravel()
        prompt = rng.integers(20, 200, n).astype(np.int32)
        err = np.zeros(n, dtype=bool)
        err[rng.random(n) < 0.001] = True
        out_tok = np.where(err, 0, tokens).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(out_tok)]).astype(np.int32)
        keep = np.repeat(~err, tokens)
        dw = np.array(dws, dtype=object)[row % decode] if disagg else None
        table = pa.table({
            "key": pa.array([f"{s}:{r}" for r in range(n)], pa.string()),
            "shard": pa.array([shard_list[s].name] * n, pa.string()),
            "row": pa.array(row),
            "prefill_worker": pa.array([w] * n, pa.string()),
            "decode_worker": pa.array(dw, pa.string()) if disagg else pa.nulls(n, pa.string()),
            "read_at": pa.array(read_at),
            "prefill_start": pa.array(ps),
            "prefill_end": pa.array(pe) if disagg else pa.nulls(n, pa.float64()),
            "decode_arrived_at": pa.array(pe + 0.005) if disagg else pa.nulls(n, pa.float64()),
            "token_times": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tt[keep])),
            "prompt_tokens": pa.array(prompt),
            "output_tokens": pa.array(out_tok),
            "kv_tokens": pa.array(prompt.astype(np.int64) if disagg else np.zeros(n, np.int64)),
            "kv_bytes": pa.array(prompt.astype(np.int64) * 46080 if disagg else np.zeros(n, np.int64)),
            "prefix_cached_tokens": pa.array(np.zeros(n, np.int64)),
            "tries": pa.array(np.ones(n, np.int32)),
            "error": pa.array(np.where(err, "RuntimeError: synthesized row error", None), pa.string()),
            "capacity_wait_s": pa.nulls(n, pa.float64()),
        }).cast(REQUEST_SCHEMA)
        # One part file per checkpoint batch, as the owner writes them (write_request_metrics:
        # pyarrow.parquet.write_table of the batch's records; here without the temporary name).
        folder = run_path / "metrics" / "requests" / shard_list[s].name
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(0, n, checkpoint_rows):
            pq.write_table(table.slice(k, checkpoint_rows), folder / f"part-{os.urandom(16).hex()}.parquet")
            metric_files += 1
        # The output shard: the output schema, with the columns the report checks filled.
        cols = {f.name: pa.nulls(n, f.type) for f in out_schema}
        cols.update({"id": pa.array([f"r{s}-{r}" for r in range(n)]), "text": pa.array(["x"] * n),
                     "error": table.column("error"), "prompt_tokens": table.column("prompt_tokens"),
                     "output_tokens": table.column("output_tokens")})
        out_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols, schema=out_schema), out_dir / shard_list[s].name)
        run.mark_done(shard_list[s], {"rows": n, "errors": int(err.sum()), "prompt_tokens": int(prompt.sum()),
                                      "output_tokens": int(out_tok.sum()),
                                      "kv_bytes": int(prompt.sum()) * 46080 if disagg else 0,
                                      "worker": w, "resumed_rows": 0, "started_at": start,
                                      "finished_at": start + dur})
        write_json(claims / f"unit-{s:05d}.0", {"worker": w.split("@")[0], "host": "bench", "pid": 1, "at": start})
        rows_by[w] += n
        tokens_by[w] += int(out_tok.sum())
        shards_by[w] += 1
    end = max(clock.values())
    steps = 0
    for w in pws + dws:
        wrole = "decode" if w in dws else role
        # Engine steps: a batch of batch_rows rows a step; decode (and colocated) one token a row.
        n_steps = (records * tokens // batch_rows // max(1, decode)) if wrole == "decode" else \
            (records * (1 if disagg else tokens) // batch_rows // prefill)
        t = np.sort(rng.uniform(T0 + 20.0, end, n_steps))
        part_edges = np.arange(T0 + 20.0, end + FLUSH_EVERY_S, FLUSH_EVERY_S)
        cut = np.searchsorted(t, part_edges)
        base = {"worker": pa.array([w] * n_steps), "role": pa.array([wrole] * n_steps), "t": pa.array(t),
                "running": pa.array(rng.integers(0, batch_rows + 1, n_steps).astype(np.int32)),
                "waiting": pa.array(np.zeros(n_steps, np.int32)),
                "kv_cache_usage": pa.array(rng.uniform(0, 0.8, n_steps)),
                "prompt_tokens": pa.array(np.zeros(n_steps, np.int32)),
                "generation_tokens": pa.array(np.full(n_steps, batch_rows, np.int32)),
                "prefix_cache_queries": pa.array(np.zeros(n_steps, np.int64)),
                "prefix_cache_hits": pa.array(np.zeros(n_steps, np.int64))}
        cols = {f.name: base.get(f.name, pa.nulls(n_steps, f.type)) for f in WORKER_SCHEMA}
        wt = pa.table(cols, schema=WORKER_SCHEMA)
        folder = run_path / "metrics" / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(len(cut) - 1):
            if cut[k + 1] > cut[k]:
                pq.write_table(wt.slice(cut[k], cut[k + 1] - cut[k]), folder / f"{w}.4242.{k:05d}.parquet")
        steps += n_steps
        run.mark_engine_ready(w, wrole, T0)
        write_json(claims / "workers" / f"{w.split('@')[0]}.json",
                   {"worker": w.split("@")[0], "beat": 1000, "at": end, "pid": 1, "ended": True})
    for w in pws:
        run.write_progress(w, {"worker": w, "rows": rows_by[w], "output_tokens": tokens_by[w], "shards": shards_by[w]})
    for k, w in enumerate(dws):
        run.publish_decode(k, f"tcp://10.0.0.{k}:5555", w, 100000, stopped=True)
    write_json(run_path / "jobs.json", {"array_tasks": [str(100 + k) for k in range(prefill)],
                                        "decode": [str(200 + k) for k in range(decode)]})
    write_json(run_path / "summary.json", {"rows": records, "wall_s": end - T0, "synthesized": True})
    import pipeline.runtime.rundir as rundir_mod

    t = time.perf_counter()
    if hasattr(rundir_mod, "wait_for_merges"):  # the code merges each done shard's metrics parts
        rundir_mod.wait_for_merges()
    waited = time.perf_counter() - t
    return {"merge_wait_s": waited, "records": records, "shards": shards, "workers": len(pws) + len(dws), "tokens_per_record": tokens,
            "checkpoint_rows": checkpoint_rows, "request_metric_files": metric_files, "worker_steps": steps,
            "files": sum(len(f) for _, _, f in os.walk(run_path)),
            "bytes": sum(os.path.getsize(os.path.join(d, x)) for d, _, f in os.walk(run_path) for x in f)}


def merge_cost(path: Path, rows: int, checkpoint_rows: int, tokens: int) -> dict | None:
    """Seconds the code takes to merge one done shard's request metrics, ``rows`` records in
    parts of ``checkpoint_rows`` (None where the code does not merge them)."""
    import pipeline.io.metrics as metrics

    if not hasattr(metrics, "compact_request_metrics"):
        return None
    synthesize(path / "run", rows, 1, 1, 1, tokens, checkpoint_rows)  # merged as it is marked done
    folder = path / "run" / "metrics" / "requests" / "part-00000.parquet"
    merged = next(folder.glob("part-merged-*.parquet"), None)
    if merged is None:  # one part: nothing to merge
        return {"rows": rows, "parts": 0, "s": 0.0}
    import pyarrow.parquet as pq

    table = pq.read_table(merged)
    merged.unlink()
    for k in range(0, rows, checkpoint_rows):  # the parts again, as the owner wrote them
        pq.write_table(table.slice(k, checkpoint_rows), folder / f"part-{os.urandom(16).hex()}.parquet")
    t = time.perf_counter()
    parts = metrics.compact_request_metrics(path / "run", "part-00000.parquet")
    return {"rows": rows, "parts": parts, "s": time.perf_counter() - t}


def timed_child(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Run ``cmd`` under ``/usr/bin/time -v``: its wall time, CPU time and peak RSS (the
    command's own: a child forked from this process would count this process's memory too)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-v", "-o", tf.name, *cmd], cwd=cwd, env=env, capture_output=True,
                           text=True)
        wall = time.perf_counter() - t0
        info = dict(ln.strip().rsplit(": ", 1) for ln in Path(tf.name).read_text().splitlines() if ": " in ln)
    return {"wall_s": wall, "cpu_s": float(info["User time (seconds)"]) + float(info["System time (seconds)"]),
            "peak_rss_mib": int(info["Maximum resident set size (kbytes)"]) / 1024, "rc": p.returncode,
            "stdout": p.stdout, "stderr": p.stderr}


def bench_records(args, work_dir: Path, env: dict[str, str]) -> dict:
    run_path = work_dir / "run"
    for old in ("run", "output", "merge", "report"):  # a kept folder of an earlier run: start afresh
        shutil.rmtree(work_dir / old, ignore_errors=True)
    t = time.perf_counter()
    made = synthesize(run_path, args.records, args.shards, args.prefill, args.decode, args.tokens,
                      args.checkpoint_rows)
    made["synthesize_s"] = time.perf_counter() - t
    made["merge"] = merge_cost(work_dir / "merge", args.merge_rows, args.checkpoint_rows, args.tokens)
    print(f"synthesized: {made}", file=sys.stderr, flush=True)
    cwd = Path(args.code).resolve() if args.code else ROOT
    res: dict[str, list[dict]] = {"status": [], "report": []}
    for r in range(args.repeats):
        for what, cmd in (("status", [sys.executable, "-m", "pipeline.status", str(run_path)]),
                          ("report", [sys.executable, "-m", "pipeline.report", str(run_path),
                                      "--out", str(work_dir / "report")])):
            m = timed_child(cmd, env, cwd)
            if m["rc"] != 0:
                raise SystemExit(f"{what} failed ({m['rc']}):\n{m['stdout'][-2000:]}\n{m['stderr'][-3000:]}")
            print(f"repeat {r} {what}: {m['wall_s']:.2f} s, CPU {m['cpu_s']:.2f} s, peak RSS "
                  f"{m['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
            res[what].append(m)
    return {"made": made, **res}


# -- checkpoints ----------------------------------------------------------------------------------
def bench_checkpoints(rows: int, every: int, tokens: int, work_dir: Path, interval_s: float = 0.0,
                      rate: float = 0.0) -> dict:
    """What a shard owner's row checkpoints cost per row, without engines: ``rows`` finished rows
    of ``tokens`` output tokens through :class:`~pipeline.io.checkpoint.RowCheckpoint` (a
    checkpoint file per ``every`` rows, at most one per ``interval_s`` seconds
    (``job.checkpoint_interval_s``), their request metrics written with each, as ``ShardOwner``
    sets it up), finishing ``rate`` rows a second (0: as fast as they can). Wall and CPU time per
    row (this process's, its threads' included; the wall includes the waits between rows),
    files written."""
    import asyncio

    from pipeline.io.checkpoint import RowCheckpoint
    from pipeline.io.metrics import request_record, write_request_metrics
    from pipeline.io.output import RowResult

    run_path = work_dir / f"ckpt-{every}"
    folder = run_path / "checkpoints" / "s0.parquet"
    ckpt = RowCheckpoint(folder, every, with_batch=lambda recs: write_request_metrics(run_path, "s0.parquet", recs),
                         interval_s=interval_s)
    t = time.time()
    results = [RowResult(generation="x" * 40, generation_token_ids=list(range(tokens)), finish_reason="length",
                         prompt_tokens=50, output_tokens=tokens, prefill_worker="colocated-0@h", prefill_start=t,
                         token_times=[t + 0.01 * k for k in range(tokens)]) for _ in range(rows)]
    files = 0

    async def serve() -> None:
        start = time.perf_counter()
        for r, res in enumerate(results):
            if rate > 0 and (due := start + r / rate - time.perf_counter()) > 0:
                await asyncio.sleep(due)
            await ckpt.add(r, res, request_record(res, key=f"0:{r}", shard="s0.parquet", row=r, read_at=t))
        await ckpt.flush()

    c0, w0 = time.process_time(), time.perf_counter()
    asyncio.run(serve())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    files = sum(len(f) for _, _, f in os.walk(run_path))
    return {"rows": rows, "every": every, "interval_s": interval_s, "rate": rate, "wall_ms_per_row": 1e3 * wall / rows, "cpu_ms_per_row": 1e3 * cpu / rows,
            "files": files}


# -- growth ---------------------------------------------------------------------------------------
GROWS = {  # top-level entry of a run directory -> (what writes it, what its file count grows with)
    "config.yaml": ("the launcher, once", "1"),
    "secret": ("the launcher, once", "1"),
    "shards.json": ("the launcher, once (every shard and unit)", "1 (bytes: shards + units)"),
    "jobs.json": ("the launcher, once", "1"),
    "summary.json": ("the launcher, at the end", "1"),
    "stop": ("the launcher, once every prefill task ended", "1"),
    "claims": ("each worker: a claim per unit taken (+1 per takeover), a heartbeat per worker",
               "units + workers"),
    "done": ("the shard's owner (or assembler), once per shard", "shards"),
    "failed": ("a shard's owner, per shard that failed as a whole", "failed shards"),
    "progress": ("each prefill/colocated worker, rewritten at most once a second", "workers"),
    "engines": ("each worker, once its engine is ready", "workers"),
    "decode": ("each decode rank, rewritten as its heartbeat; lost.json by the launcher", "decode ranks"),
    "joined": ("join(): one per array task added", "tasks joined"),
    "checkpoints": ("a shard's owner: a Parquet file per job.checkpoint_rows finished rows, at most one per "
                    "job.checkpoint_interval_s; removed once the shard is done",
                    "run time / checkpoint_interval_s (at most) of the shards in flight"),
    "parts": ("split shards: a part file + mark per unit, checkpoints per part; removed once assembled",
              "units of split shards in flight"),
    "metrics/requests": ("a shard's owner: a Parquet part per checkpoint batch, merged into one once the shard is "
                         "done (before bcc80ba: kept)", "shards (+ the checkpoint batches of the shards in flight; "
                         "before bcc80ba: rows / checkpoint_rows)"),
    "metrics/workers": ("each worker's engine steps: a Parquet part per FLUSH_EVERY_S (30 s), every MERGE_PARTS "
                        "(16) of a level merged into one (before this: kept)",
                        "workers x 15 a level, levels = log16(run time / 30 s) (before: workers x run time)"),
    "metrics/dram": ("offload=dram: one per decode process, at its end", "decode processes"),
    "logs": ("submitit: a few files per worker job", "workers"),
    "report": ("python -m pipeline.report", "1 folder, 4-6 files"),
}


def count_files(run_path: Path) -> dict[str, tuple[int, int]]:
    """Files and bytes under each top-level entry of a run directory (metrics/ by sub-folder)."""
    out: dict[str, tuple[int, int]] = {}
    for entry in sorted(run_path.iterdir()):
        subs = sorted(entry.iterdir()) if entry.name == "metrics" and entry.is_dir() else [entry]
        for sub in subs:
            key = f"metrics/{sub.name}" if entry.name == "metrics" else entry.name
            if sub.is_file():
                out[key] = (1, sub.stat().st_size)
                continue
            n = b = 0
            for d, _, files in os.walk(sub):
                for f in files:
                    n += 1
                    b += os.path.getsize(os.path.join(d, f))
            out[key] = (n, b)
    return out


# -- steps ----------------------------------------------------------------------------------------
def bench_steps(work: Path, hours: float, steps_per_s: float, merge: int) -> dict:
    """A worker's :class:`~pipeline.engine.steps.StepRecorder` over ``hours`` of simulated run
    time (``steps_per_s`` steps fed as vLLM's stats objects, a flush per ``FLUSH_EVERY_S``),
    with ``MERGE_PARTS = merge`` (0: never). Returns parts, steps, files at the end, the
    recorder's CPU seconds, and the seconds and rows of reading them back."""
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    from pipeline.engine import steps as steps_mod
    from pipeline.io.metrics import read_worker_metrics

    steps_mod.MERGE_PARTS = merge if merge > 0 else 10**9
    rec = steps_mod.StepRecorder(work, "decode-0@h", "decode")
    it = IterationStats()
    it.num_generation_tokens = 8
    stats = SchedulerStats(num_running_reqs=8, kv_cache_usage=0.5)
    parts = int(hours * 3600 / steps_mod.FLUSH_EVERY_S)
    per_part = int(steps_per_s * steps_mod.FLUSH_EVERY_S)
    cpu0 = time.process_time()
    for _ in range(parts):
        for _ in range(per_part):
            rec.record(stats, it)
        rec.flush()
    cpu = time.process_time() - cpu0
    t0 = time.perf_counter()
    rows = read_worker_metrics(work).num_rows
    read_s = time.perf_counter() - t0
    files = len(list((work / "metrics" / "workers").glob("*.parquet")))
    return {"merge": merge, "parts": parts, "steps": parts * per_part, "files": files, "cpu_s": cpu,
            "read_s": read_s, "read_rows": rows}


# -- main -----------------------------------------------------------------------------------------
def _median(ms: list[dict], key: str) -> float:
    return statistics.median(m[key] for m in ms)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("claims", help="units taken by claimant processes")
    c.add_argument("--units", type=int, default=10000)
    c.add_argument("--claimants", type=int, default=32)
    c.add_argument("--repeats", type=int, default=1)
    r = sub.add_parser("records", help="status and report over synthesized request records")
    r.add_argument("--records", type=int, default=1_000_000)
    r.add_argument("--shards", type=int, default=1000)
    r.add_argument("--prefill", type=int, default=8, help="prefill workers (colocated ones with --decode 0)")
    r.add_argument("--decode", type=int, default=8, help="decode workers (0: a colocated run)")
    r.add_argument("--tokens", type=int, default=32, help="output tokens of every record")
    r.add_argument("--checkpoint-rows", type=int, default=4,
                   help="records per metrics part file (job.checkpoint_rows; default the job's default)")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--merge-rows", type=int, default=1000,
                   help="rows of the shard whose metrics merge is timed apart (as a worker does it once the shard is done)")
    r.add_argument("--keep", metavar="DIR", help="synthesize into DIR and keep it")
    k = sub.add_parser("checkpoints", help="a shard owner's row checkpoints and request metrics, per row")
    k.add_argument("--rows", type=int, default=2000)
    k.add_argument("--every", default="4,64", help="comma-separated job.checkpoint_rows values")
    k.add_argument("--interval", default="0", help="comma-separated job.checkpoint_interval_s values (seconds)")
    k.add_argument("--rate", type=float, default=0.0, help="rows finishing per second (0: as fast as they can)")
    k.add_argument("--tokens", type=int, default=32)
    k.add_argument("--repeats", type=int, default=3)
    st = sub.add_parser("steps", help="one worker's engine-step metric files over hours")
    st.add_argument("--hours", type=float, default=10.0)
    st.add_argument("--steps-per-s", type=float, default=20.0)
    st.add_argument("--merge", default="16,0", help="comma-separated MERGE_PARTS values (0: no merging)")
    g = sub.add_parser("growth", help="files of each kind in run directories")
    g.add_argument("run_dirs", nargs="*", metavar="RUN_DIR")
    from tools.bench_parts import scale_engines
    scale_engines.add_parser(sub)
    for p in (c, r, k):
        p.add_argument("--code", metavar="DIR", help="import pipeline from DIR (another commit's export)")
        p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)

    if args.what == "engines":
        scale_engines.check_args(ap, args)
        result = scale_engines.main(args, _use_code(None))
        if args.json:
            from tools.benchlib.results import write_json
            write_json(args.json, result)
        return 0
    if args.what == "steps":
        table = []
        for merge in (int(x) for x in args.merge.split(",")):
            with tempfile.TemporaryDirectory(prefix="hS-bench-steps-") as tmp:
                m = bench_steps(Path(tmp), args.hours, args.steps_per_s, merge)
            table.append([merge or "off", m["parts"], m["steps"], m["files"], f"{m['cpu_s']:.1f}",
                          f"{m['read_s']:.2f}", m["read_rows"]])
        print(f"one worker's engine-step metrics over {args.hours:g} h at {args.steps_per_s:g} steps/s "
              f"(a part per 30 s), no engine\n")
        print(md_table(["MERGE_PARTS", "parts flushed", "steps", "files at the end", "recorder CPU s",
                        "read back s", "rows read"], table, "rrrrrrr"))
        print("\n" + machine_text())
        return 0
    if args.what == "growth":
        rows = [[k, *v] for k, v in GROWS.items()]
        print(md_table(["entry", "written by", "files grow with"], rows))
        for rd in args.run_dirs:
            counts = count_files(Path(rd))
            print(f"\n{rd}:\n")
            print(md_table(["entry", "files", "bytes"], [[k, n, b] for k, (n, b) in counts.items()], "lrr"))
        return 0

    env = _use_code(args.code)
    code = args.code or "this checkout"
    with tempfile.TemporaryDirectory(prefix="hS-bench-scale-") as tmp:
        work = Path(args.keep) if getattr(args, "keep", None) else Path(tmp)
        if args.what == "checkpoints":
            table, result = [], {"checkpoints": []}
            for every in (int(x) for x in args.every.split(",")):
                for interval in (float(x) for x in args.interval.split(",")):
                    runs = []
                    for rep in range(args.repeats):
                        d = work / f"ck-{every}-{interval}-{rep}"
                        runs.append(bench_checkpoints(args.rows, every, args.tokens, d, interval, args.rate))
                        shutil.rmtree(d, ignore_errors=True)
                    result["checkpoints"] += runs
                    table.append([every, interval, args.rows, f"{_median(runs, 'wall_ms_per_row'):.3f}",
                                  f"{_median(runs, 'cpu_ms_per_row'):.3f}", runs[-1]["files"]])
            pace = f"{args.rate:g} rows/s" if args.rate > 0 else "as fast as they can"
            print(f"row checkpoints and request metrics ({code}), no engine: {args.rows} rows of {args.tokens} "
                  f"tokens finishing {pace}; {args.repeats} repeats, medians\n")
            print(md_table(["job.checkpoint_rows", "job.checkpoint_interval_s", "rows", "wall ms/row", "CPU ms/row",
                            "files written"], table, "rrrrrr"))
        elif args.what == "claims":
            runs = []
            for k in range(args.repeats):
                d = work / f"claims-{k}"
                d.mkdir(parents=True)
                m = bench_claims(args.units, args.claimants, d)
                print(f"repeat {k}: {m}", file=sys.stderr, flush=True)
                runs.append(m)
                shutil.rmtree(d, ignore_errors=True)
            print(f"claims ({code}): {args.units} units, {args.claimants} claimant processes, no engines; "
                  f"{args.repeats} repeat(s), medians\n")
            print(md_table(["units", "claimants", "wall s", "claimants' CPU s", "each unit once",
                            "units per claimant (min-max)"],
                           [[args.units, args.claimants, f"{_median(runs, 'wall_s'):.1f}",
                             f"{_median(runs, 'cpu_s'):.1f}", "yes" if all(m["each_once"] for m in runs) else "NO",
                             "-".join(map(str, runs[-1]["units_per_claimant_min_max"]))]], "rrrrll"))
            result = {"claims": runs}
        else:
            work.mkdir(parents=True, exist_ok=True)
            m = bench_records(args, work, env)
            made = m["made"]
            print(f"status and report ({code}) over SYNTHESIZED request records (no engine ran): "
                  f"{made['records']} records of {made['tokens_per_record']} output tokens, {made['shards']} shards, "
                  f"{made['workers']} workers, {made['request_metric_files']} request metrics files "
                  f"({made['checkpoint_rows']} records each), {made['worker_steps']} worker steps; run directory "
                  f"{made['files']} files, {made['bytes'] / 2**20:.0f} MiB; {args.repeats} repeat(s), medians\n")
            mg = made.get("merge")
            if mg:
                print(f"merging one done shard's request metrics ({mg['rows']} records in {mg['parts']} parts), "
                      f"as its worker does in the background: {mg['s']:.2f} s\n")
            print(md_table(["command", "wall s", "CPU s", "peak RSS MiB"],
                           [[f"python -m pipeline.{w}", f"{_median(m[w], 'wall_s'):.2f}", f"{_median(m[w], 'cpu_s'):.2f}",
                             f"{_median(m[w], 'peak_rss_mib'):.0f}"] for w in ("status", "report")], "lrrr"))
            print("\nreport's summary (last repeat):\n" + m["report"][-1]["stdout"].strip())
            result = {"records": {k: v if k == "made" else [{x: y for x, y in e.items() if x not in ("stdout", "stderr")}
                                                          for e in v] for k, v in m.items()}}
        if args.json:
            from tools.benchlib.results import write_json
            write_json(args.json, result)
    print("\n" + machine_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
