"""Where a run's end went (issue #40): per engine, the rows it decoded (alone: its own units';
in: handed off to it; out: it prefilled for another), when it prefilled first and decoded its
last token, and how long it then sat idle while another engine still decoded, in seconds from
the run's first row read; with ``--rows``, every row (prefill worker, decode worker, unit:row,
read, prefill start, KV arrival, first and last token). Read from the run's request metrics
(:func:`pipeline.io.metrics.read_request_metrics`)::

    .venv/bin/python tools/run_tail.py RUN_DIR [RUN_DIR ...] [--rows] [--steps N]

``--steps N``: each engine's median step while it decoded exactly N rows and nothing else (its
step records, ``metrics/workers``), and the run's window (first row read to last token) over
the median of those: the window in steps, which the engines' speed, moving by 1.6x between runs
of one layout on the capped test Slurm, does not move.

A run whose last units were each held by one busy engine shows engines idle at the end for
about one unit's time (a row's decode, ~25 s for 256 tokens on the test Slurm).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import statistics  # noqa: E402

from pipeline.io.metrics import read_request_metrics  # noqa: E402
from tools.bench_parts.e2e.elastic import step_s  # noqa: E402


def first_read(rows: list[dict]) -> float:
    """When the run's first row was read (epoch seconds): the time every figure is counted from."""
    return min(r["read_at"] for r in rows if r["read_at"])


def engine_ends(rows: list[dict], t0: float) -> dict[str, dict]:
    """Engine (worker name without host) -> ``alone``, ``in``, ``out`` (rows), ``first_prefill``
    and ``last_token`` (seconds from ``t0``)."""
    out: dict[str, dict] = defaultdict(lambda: {"alone": 0, "in": 0, "out": 0, "first_prefill": None,
                                                "last_token": None})
    for r in rows:
        p, d = r["prefill_worker"].split("@")[0], (r["decode_worker"] or "").split("@")[0]
        decoded_by = out[d or p]
        if d:
            decoded_by["in"] += 1
            out[p]["out"] += 1
        else:
            decoded_by["alone"] += 1
        if r["token_times"]:
            last = r["token_times"][-1] - t0
            decoded_by["last_token"] = max(decoded_by["last_token"] or 0.0, last)
        if r["prefill_start"]:
            first, seen = r["prefill_start"] - t0, out[p]["first_prefill"]
            out[p]["first_prefill"] = first if seen is None else min(seen, first)
    return dict(out)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--rows", action="store_true", help="every row too")
    ap.add_argument("--steps", type=int, metavar="N", help="each engine's median step at N rows; the window in steps")
    args = ap.parse_args()
    for run_dir in args.run_dirs:
        rows = read_request_metrics(run_dir).to_pylist()
        if not rows:
            print(f"{run_dir}: no request metrics")
            continue
        t0 = first_read(rows)
        ends = engine_ends(rows, t0)
        end = max(e["last_token"] or 0.0 for e in ends.values())
        print(f"{run_dir.name}: last token at {end:.1f} s")
        print("| engine | alone | in | out | first prefill s | last token s | idle at the end s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, e in sorted(ends.items()):
            idle = None if e["last_token"] is None else end - e["last_token"]
            print(f"| {name} | {e['alone']} | {e['in']} | {e['out']} | {_s(e['first_prefill'])} | "
                  f"{_s(e['last_token'])} | {_s(idle)} |")
        if args.steps:
            steps = step_s(run_dir, args.steps)
            if steps:
                med = statistics.median(steps.values())
                print(f"steps of {args.steps} rows: " + ", ".join(f"{w} {v:.3f} s" for w, v in sorted(steps.items()))
                      + f"; window {end:.1f} s = {end / med:.0f} steps of {med:.3f} s")
        if args.rows:
            for r in sorted(rows, key=lambda r: (r["prefill_start"] or 0, r["key"])):
                tt = r["token_times"] or []
                rel = [None if v is None else v - t0 for v in (r["read_at"], r["prefill_start"], r["decode_arrived_at"])]
                print(f"  {r['prefill_worker'].split('@')[0]:<10} {(r['decode_worker'] or '-').split('@')[0]:<10} "
                      f"{r['shard']}:{r['row']} read {_s(rel[0])} prefill {_s(rel[1])} "
                      f"KV {_s(rel[2])} first {_s(tt[0] - t0 if tt else None)} last {_s(tt[-1] - t0 if tt else None)}")


if __name__ == "__main__":
    main()
