"""An engine's decode step: a P/D engine (vLLM with the pipeline's NIXL connector) against a
colocated one (no connector), each serving the same rows alone (issue #40).

Each setting runs two engines at once, one per core (``cpus="0"`` and ``"1"``, as a local 1P:1D
or colocated 2-worker run places them), each in a fresh process pinned to its core. Each engine
serves ``--rows`` requests of ``--prompt-tokens`` tokens together, ``--new-tokens`` greedy tokens
each (``ignore_eos``), ``--reps`` times; the first repeat (torch's warm-up) is left out. The
prompts are the same each repeat, so from the second on vLLM's prefix cache holds them and the
wall is mostly decode. Per
repeat: the wall time, and the median step while all rows decoded (steps of the engine's own
per-step records, :class:`pipeline.engine.steps.StepRecorder`, with ``--rows`` running and no
prompt tokens). Settings (``--settings``): ``colocated``, or ``decode:US`` (a decode engine,
``transport.nixl_progress_delay_us=US``), run in turn, ``--rounds`` times::

    .venv/bin/python tools/bench_step.py [--settings colocated,decode:1000,decode:20000] [--rounds 2]

Prints a Markdown table: per setting, the median step (ms) and wall (s) over both engines,
repeats and rounds, and the ratio of the median step to colocated's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import csv_list, parser  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402


async def _serve(setting: str, cpu: str, rows: int, prompt_tokens: int, new_tokens: int, reps: int) -> list[dict]:
    """One engine of ``setting`` on core ``cpu``: ``reps`` rounds of ``rows`` requests."""
    import pipeline.engine.steps as steps
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from pipeline.config import compose
    from pipeline.engine.build import build_engine
    from pipeline.engine.steps import StepRecorder
    from pipeline.engine.stream import stream
    from pipeline.runtime.addresses import worker_host
    from pipeline.runtime.ports import side_channel

    role, _, delay = setting.partition(":")
    cfg = compose(["+job=summarize", *([f"transport.nixl_progress_delay_us={delay}"] if delay else [])])
    steps.FLUSH_EVERY_S = 1e9  # every step stays in memory: they are read below
    recorder = StepRecorder(Path(f"/tmp/pd-bench-step-{os.getpid()}"), f"{role}-{cpu}", role)
    if role == "colocated":
        engine = build_engine(cfg, role, cpus=cpu, recorder=recorder)
    else:
        host = worker_host(cfg)
        with side_channel(cfg, 1, host) as port:
            engine = build_engine(cfg, role, cpus=cpu, side_channel=(host, port), recorder=recorder)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    out = []
    try:
        for rep in range(reps):
            first, t0 = len(recorder.rows), time.monotonic()
            await asyncio.gather(*[stream(engine, f"r{rep}-{i}", [100 + (j * 7 + i) % 5000 for j in range(prompt_tokens)],
                                          params) for i in range(rows)])
            wall = time.monotonic() - t0
            recs = recorder.rows[first:]
            decode = [b["t"] - a["t"] for a, b in zip(recs, recs[1:])
                      if a["running"] == b["running"] == rows and b["prompt_tokens"] == 0]
            out.append({"wall_s": wall, "step_s": statistics.median(decode) if decode else None})
    finally:
        engine.shutdown()
    return out


def _pair(setting: str, args: argparse.Namespace) -> list[dict]:
    """Two engines of ``setting`` at once, on cores 0 and 1; their repeats after the first."""
    procs = [subprocess.Popen(["taskset", "-c", cpu, sys.executable, __file__, "--_one", setting, cpu,
                               "--rows", str(args.rows), "--prompt-tokens", str(args.prompt_tokens),
                               "--new-tokens", str(args.new_tokens), "--reps", str(args.reps)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cpu in ("0", "1")]
    reps = []
    for p in procs:
        stdout, stderr = p.communicate()
        line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{setting}: an engine failed\n{stderr[-2000:]}", file=sys.stderr)
            continue
        reps += json.loads(line[7:])[1:]
    return reps


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="tools/bench_step.py")
    ap.add_argument("--settings", default="colocated,decode:1000,decode:20000",
                    help="colocated and/or decode:US (default colocated,decode:1000,decode:20000)")
    ap.add_argument("--rounds", type=int, default=2, help="times each setting runs, in turn (default 2)")
    ap.add_argument("--rows", type=int, default=8, help="requests each engine serves together (default 8)")
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=4, help="repeats per engine, the first left out (default 4)")
    ap.add_argument("--_one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._one:
        res = asyncio.run(_serve(args._one[0], args._one[1], args.rows, args.prompt_tokens, args.new_tokens, args.reps))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    settings = csv_list(args.settings)
    results: dict[str, list[dict]] = {s: [] for s in settings}
    for rnd in range(args.rounds):
        for s in settings:
            reps = _pair(s, args)
            results[s] += reps
            print(f"round {rnd + 1} {s}: steps " + ", ".join(f"{r['step_s'] * 1e3:.0f}" for r in reps if r["step_s"])
                  + " ms; walls " + ", ".join(f"{r['wall_s']:.1f}" for r in reps) + " s", file=sys.stderr, flush=True)
    steps = {s: [r["step_s"] for r in rs if r["step_s"]] for s, rs in results.items()}
    med = {s: statistics.median(v) for s, v in steps.items() if v}
    base = med.get("colocated")
    rows = [[s, f"{m * 1e3:.1f}", f"{min(steps[s]) * 1e3:.0f}-{max(steps[s]) * 1e3:.0f}",
             f"{statistics.median(r['wall_s'] for r in results[s]):.2f}",
             f"{m / base:.2f}x" if base else "-", len(results[s])] for s, m in med.items()]
    print(md_table(["setting", "decode step ms (median)", "range", "wall s (median)", "step / colocated", "samples"],
                   rows, "lrrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
