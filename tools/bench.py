"""End-to-end benchmark: the pipeline against raw vLLM, and disaggregated against colocated.

What it measures, in one run, on this machine, over the same prompts (Parquet inputs it builds
itself in a temporary directory from CPython standard-library docstrings, PSF License):

1. **Pipeline colocated vs raw vLLM** (``raw``, ``coloc1``), uniform short workload. The pipeline
   runs ``python -m pipeline +job=summarize pools=colocated pools.prefill=1`` (one worker on
   every core: ``cluster.cpu_bind=partition`` gives it ``cpu_slices(1)``, i.e. all cores) with
   ``job.batch_rows`` = all rows, so every row is in flight at once. Raw vLLM is
   ``vllm.LLM.generate`` in a child process over the same token ids, rendered by the pipeline's
   own :func:`pipeline.io.prompts.make_prompts` from the config the pipeline composes
   (``pipeline.config.compose`` with the same overrides), with the same sampling (greedy,
   ``max_new_tokens``), dtype, ``max_model_len``, ``enforce_eager``, ``gpu_memory_utilization``,
   seed, and the same process environment (``pipeline.engine.env.engine_env``: the KV cache
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
   With ``--workloads ...,long``, a third workload in the seeds' regime for P/D: ``--long-rows``
   rows of 3-6K-token documents (prompt:output above 40:1 at 64 new tokens), run with
   ``model.max_model_len=8192`` (so ``offload=auto`` gives the decode DRAM tier).
   ``--only ...,disaggbefore,disaggpush,disaggsync,disaggasyncload,disaggdram,disagglocal,disaggtp3p,disaggtp3d,auto`` adds variants (section 2f, one column
   each beside colocated and the default): ``disaggbefore`` is the pipeline as before issue #17
   (push, the prefill engine with vLLM's async scheduling and empty steps at vLLM's pace),
   ``disaggpush`` is ``transport=nixl_push``, ``disaggsync`` schedules the decode engine in step
   (``async_scheduling`` off), ``disaggasyncload`` loads a hand-off's KV with vLLM's asynchronous
   READ (``transport.sync_kv_load=false``, as before), ``disaggdram`` hands KV off through the decode DRAM
   tier (``offload=dram``), ``disaggtp3p`` / ``disaggtp3d`` run the prefill / decode pool at TP 3
   (issue #28; its 3 ranks share its worker's core; ``offload=none``, the shapes without the
   tier), ``disagglocal`` prefills rows under 512 prompt
   tokens on decode, ``auto`` is ``pools=auto`` over the same 2 workers (what it chose is in the
   table); the table gives each pool's busy fraction (share of the measured
   window with a request running in the engine, :func:`pipeline.report.summary.worker_stats`),
   the hand-off p50/p99 against the target (NIXL transfer p50 + 2 decode steps p50), the p50 split
   into NIXL's own transfer time and the rest (messages, waiting for an engine step), the KV bytes
   and NIXL transfers per request, and the prefill engine's CPU.
   **Elastic pools** (issue #40, section 2g; ``--only coloc2,disagg,disaggelastic --workloads
   prefill,decode,mixed,skewed``): each workload run colocated (2 workers), static 1P:1D and
   elastic 1P:1D (``pools.elastic=true``) on the same 2 cores; the table gives each one's
   makespan against the better of static and colocated, each pool's busy fraction, the decode
   ranks' ITL p99 and how rows were served (:mod:`tools.bench_parts.e2e.elastic`). ``--only
   slurm`` (section 2h; the 4-node test Slurm up: ``slurm/start-test-cluster.sh --nodes 4``) runs
   the same workloads as 4 workers there, two to a core: colocated, and each starting split 1P:3D,
   2P:2D, 3P:1D static and elastic, against the best of colocated and the static splits.
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
  wall_s`` of :func:`pipeline.report.summary.summarize_run`, where ``wall_s`` runs from the first row's
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
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench_parts.e2e.configs import CONFIGS, PARTS, WORKLOADS, run_order, selected  # noqa: E402
from tools.bench_parts.e2e.inputs import build_workloads  # noqa: E402
from tools.bench_parts.e2e.processes import with_retry  # noqa: E402
from tools.bench_parts.e2e.report import report  # noqa: E402
from tools.bench_parts.e2e.runs import run_pipeline_config, run_raw  # noqa: E402
from tools.benchlib.cli import csv_list, parser  # noqa: E402
from tools.benchlib.machine import machine_text  # noqa: E402
from tools.benchlib.procfs import wait_quiet  # noqa: E402
from tools.benchlib.procs import python  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="tools/bench.py")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (default 3)")
    ap.add_argument("--rows", type=int, default=16, help="rows per workload (default 16)")
    ap.add_argument("--shards", type=int, default=2, help="shards per workload (default 2)")
    ap.add_argument("--inflight", type=int, default=8,
                    help="rows in flight in total for the disaggregated/colocated comparison (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="job.sampling.max_new_tokens (default 64)")
    ap.add_argument("--long-frac", type=float, default=0.25, help="fraction of long rows in 'mixed' (default 0.25)")
    ap.add_argument("--long-tokens", type=int, default=2500, help="mean text tokens of a long row (default 2500)")
    ap.add_argument("--long-rows", type=int, default=6,
                    help="rows of the 'long' workload (3-6K-token prompts, run with model.max_model_len=8192; default 6)")
    ap.add_argument("--dtype", default="bfloat16", help="model.dtype (default bfloat16)")
    ap.add_argument("--only", default="raw,coloc,disagg",
                    help="parts: raw, coloc (= coloc1 + coloc2), coloc1, coloc2, disagg, disaggspin "
                         "(disaggregated with NIXL's busy-polling progress thread, as before), disaggchunk (prefill "
                         "chunks of 512 tokens), disaggbefore (push, prefill engine with async scheduling and "
                         "unpaced idle steps: as before issue #17), disaggpush (transport=nixl_push), disaggsync (decode "
                         "engine without async scheduling), disaggasyncload (transport.sync_kv_load=false), disaggdram (offload=dram), disagglocal "
                         "(pools.local_prefill_tokens=512), disaggtp3p / disaggtp3d (prefill / decode pool at TP 3), auto (pools=auto), "
                         "disaggelastic (pools.elastic=true; with coloc2 and disagg on --workloads prefill,decode,mixed,skewed: "
                         "section 2g, issue #40), disaggelastic1ms (the same, NIXL's progress thread waking every 1 ms: the "
                         "default on a CPU before 20 ms), slurm (the same on the 4-node test Slurm from 1P:3D, 2P:2D, 3P:1D: section 2h); "
                         "those after disagg are not in the default")
    ap.add_argument("--order", choices=("fixed", "reverse", "rotate"), default="fixed",
                    help="the configurations' order in each repeat: fixed (the bench's own, colocated first), reverse, or "
                         "rotate (one place later each repeat; with --repeats N for N configurations each runs once in "
                         "every place) (default fixed)")
    ap.add_argument("--workloads", default="uniform,mixed",
                    help="for coloc2/disagg*: uniform, mixed, long, and the elastic part's prefill, decode, skewed "
                         "(default uniform,mixed)")
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
    ap.add_argument("--report-from", metavar="JSON",
                    help="print the report of an earlier --json (one stopped early: the runs it finished), run nothing")
    ap.add_argument("--_raw", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.report_from:
        from pipeline.config import compose

        saved = json.loads(Path(args.report_from).read_text())
        was = argparse.Namespace(**saved["args"])
        names = [n for n, rs in saved["results"].items() if rs]
        print(report(was, compose(["+job=summarize", f"model.dtype={was.dtype}"]), saved["workloads"],
                     {n: saved["results"][n] for n in names}, names, saved["failures"], None, 0.0, {}))
        return 0
    if args._raw:
        from tools.bench_parts.e2e.raw import raw_main

        raw_main(*args._raw)
        return 0
    parts = set(csv_list(args.only))
    bad = parts - PARTS - {n.split("-")[0] for n in CONFIGS}  # a part, or one configuration by name
    if bad:
        ap.error(f"--only: unknown part(s) {sorted(bad)}")
    wls = set(csv_list(args.workloads))
    if wls - WORKLOADS:
        ap.error(f"--workloads: some of {sorted(WORKLOADS)}")
    if args.repeats < 1 or args.rows < args.shards or args.inflight < 2:
        ap.error("need --repeats >= 1, --rows >= --shards, --inflight >= 2")

    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    cfg = compose(["+job=summarize", f"model.dtype={args.dtype}"])
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="pd-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    wl = build_workloads(work, args.rows, args.shards, args.long_frac, args.long_tokens,
                         cfg.model.max_model_len, args.max_new_tokens, load_tokenizer(cfg),
                         long_rows=args.long_rows if "long" in wls else 0,
                         elastic=bool(wls & {"prefill", "decode", "skewed"}))
    names = selected(parts, wls)
    machine = machine_text()
    print(f"work dir: {work}", file=sys.stderr)
    results: dict[str, list[dict]] = {n: [] for n in names}
    failures: list[dict] = []
    for rep in range(args.repeats):
        for n in run_order(names, rep, args.order):
            w = wl[CONFIGS[n][1]]
            quiet = wait_quiet(args.quiet_wait_s, args.quiet_below) if args.quiet_wait_s > 0 else {}
            t = time.time()
            r = with_retry((lambda: run_raw(rep, args, w, work)) if n == "raw" else
                           (lambda: run_pipeline_config(n, rep, args, w, work)), n, rep, failures)
            if r is None:
                continue
            r.update(quiet)
            results[n].append(r)
            if args.json:  # after every run: a bench stopped early (or a report that fails) keeps its runs
                write_json(args.json, {"args": vars(args), "workloads": wl, "results": results, "failures": failures,
                                       "machine": machine, "finished": False})
            print(f"[{time.time() - t_start:6.0f} s] {n} repeat {rep + 1}/{args.repeats}: "
                  f"{r['output_tokens_per_s']:.1f} output tok/s ({r['output_tokens']} tokens), "
                  f"run {time.time() - t:.0f} s, other load {r['cpu']['other_load_cores']:.2f} cores, "
                  f"waited {quiet.get('waited_s', 0):.0f} s for <{args.quiet_below:g} busy cores "
                  f"(was {quiet.get('busy_cores_before', 0):.2f})"
                  + (f", killed leftovers {r['leftover_processes_killed']}" if r.get("leftover_processes_killed") else ""),
                  file=sys.stderr, flush=True)

    kv_text = None
    if args.kv:
        kv = subprocess.run(python(REPO / "tools" / "bench_kv.py", "--sizes-mib", "4", "64", "--repeats", "3",
                                   "--tls", "default", "--layouts", "whole,128"),
                            cwd=REPO, capture_output=True, text=True)
        kv_text = kv.stdout + (f"\n(exit status {kv.returncode}: {kv.stderr[-500:]})" if kv.returncode else "")

    facts: dict[str, Any] = {}
    print(report(args, cfg, wl, results, names, failures, kv_text, time.time() - t_start, facts))
    if args.json:
        write_json(args.json, {"args": vars(args), "workloads": wl, "results": results, "failures": failures,
                               "facts": facts, "machine": machine_text()})
    if not args.keep and not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
