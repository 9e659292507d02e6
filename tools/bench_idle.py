"""What a prefill engine costs while it only holds KV for decode (issue #17: under 0.05 of a
core): one real prefill engine (vLLM, the pipeline's NIXL pull connector) prefills a few
requests for a remote decode that never comes, so it holds their KV (vLLM keeps it for
``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` seconds), and the CPU time of the engine's processes is
read from ``/proc`` over the next ``--window-s`` seconds. Once with the pipeline's pacing of
empty steps (``transport.prefill_idle_pause_ms``, default 40) and once at vLLM's pace (0),
alternating, each in a fresh process pinned to one core::

    .venv/bin/python tools/bench_idle.py [--repeats 2] [--window-s 10] [--requests 4]

Prints a Markdown table: CPU (cores) and engine steps per second while holding, per setting,
medians over repeats.
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

from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402


def _cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _thread_seconds(pids: list[int]) -> dict[str, float]:
    """CPU seconds per thread of ``pids``, keyed ``"pid/tid name"``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                head, rest = task.joinpath("stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            fields = rest.split()
            out[f"{pid}/{task.name} {head.split('(', 1)[1]}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


async def _hold(pause_ms: float, window_s: float, requests: int, run_dir: str) -> dict:
    import pipeline.engine.steps as steps
    from pipeline.config import compose
    from pipeline.engine.build import build_engine
    from pipeline.engine.steps import StepRecorder
    from pipeline.engine.stream import prefill_params, stream
    from pipeline.roles.handoff import REMOTE_DECODE
    from pipeline.runtime.addresses import worker_host
    from pipeline.runtime.ports import side_channel

    cfg = compose(["+job=summarize", "transport=nixl_pull", "offload=none",
                   f"transport.prefill_idle_pause_ms={pause_ms}"])
    host = worker_host(cfg)
    steps.FLUSH_EVERY_S = 1e9  # keep every step in memory: they are counted below
    recorder = StepRecorder(Path(run_dir), "prefill-0", "prefill")
    with side_channel(cfg, 1, host) as port:
        engine = build_engine(cfg, "prefill", cpus="0", side_channel=(host, port), recorder=recorder)
    try:
        for i in range(requests):
            await stream(engine, f"hold-{i}", list(range(100, 100 + 300 + 50 * i)), prefill_params(REMOTE_DECODE))
        await asyncio.sleep(1.0)  # past the grace period
        pids = _descendants(os.getpid())
        steps0 = len(recorder.rows)
        c0, th0, t0 = _cpu_seconds(pids), _thread_seconds(pids), time.monotonic()
        await asyncio.sleep(window_s)
        c1, th1, t1 = _cpu_seconds(pids), _thread_seconds(pids), time.monotonic()
        threads = sorted(((k, (v - th0.get(k, 0.0)) / (t1 - t0)) for k, v in th1.items()), key=lambda kv: -kv[1])
        return {"pause_ms": pause_ms, "cores": (c1 - c0) / (t1 - t0),
                "steps_per_s": (len(recorder.rows) - steps0) / (t1 - t0),
                "top_threads": [(k.split(" ", 1)[1], round(v, 3)) for k, v in threads[:3]]}
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="tools/bench_idle.py")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--requests", type=int, default=4, help="prefilled requests whose KV is held")
    ap.add_argument("--pauses-ms", default="40,0", help="transport.prefill_idle_pause_ms values (default 40,0)")
    ap.add_argument("--_one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._one:
        res = asyncio.run(_hold(float(args._one[0]), args.window_s, args.requests, args._one[1]))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    pauses = [float(x) for x in args.pauses_ms.split(",")]
    results: dict[float, list[dict]] = {p: [] for p in pauses}
    for rep in range(args.repeats):
        for p in pauses:
            run_dir = f"/tmp/pd-bench-idle-{os.getpid()}-{rep}-{p:g}"
            out = subprocess.run([sys.executable, __file__, "--_one", str(p), run_dir, "--window-s",
                                  str(args.window_s), "--requests", str(args.requests)],
                                 cwd=ROOT, capture_output=True, text=True)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"pause {p:g} ms repeat {rep + 1}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(line[7:])
            results[p].append(r)
            print(f"pause {p:g} ms repeat {rep + 1}: {r['cores']:.3f} cores, {r['steps_per_s']:.0f} steps/s; "
                  f"busiest threads {r['top_threads']}",
                  file=sys.stderr, flush=True)
    rows = []
    for p, rs in results.items():
        if rs:
            rows.append([f"{p:g}" + (" (vLLM's pace)" if p == 0 else ""),
                         f"{statistics.median(r['cores'] for r in rs):.3f}",
                         ", ".join(f"{r['cores']:.3f}" for r in rs),
                         f"{statistics.median(r['steps_per_s'] for r in rs):.0f}"])
    print(md_table(["transport.prefill_idle_pause_ms", "CPU while holding KV (cores, median)", "per repeat",
                    "engine steps/s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
