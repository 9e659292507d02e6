"""The command line: ``python -m pipeline.report RUN_DIR [--compare OTHER_RUN_DIR] [--out DIR]
[--stall-ms 60]`` (see :mod:`pipeline.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable

from pipeline.report.compare import compare_reports
from pipeline.report.load import one_line
from pipeline.report.summary import STALL_S, summarize_run
from pipeline.report.text import summary_text
from pipeline.report.write import write_report


def parser() -> argparse.ArgumentParser:
    """The command's arguments and flags (also docs/cli.md, ``tools/manual.py``)."""
    p = argparse.ArgumentParser(
        prog="python -m pipeline.report",
        description="Write a run's performance report (report.json and PNGs) from its metrics.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    p.add_argument("--compare", metavar="OTHER_RUN_DIR",
                   help="also compare with this run (RUN_DIR = a, OTHER_RUN_DIR = b)")
    p.add_argument("--labels", nargs=2, metavar=("A", "B"),
                   help="names of the two runs in the comparison (default: their modes, "
                        "or their directory names)")
    p.add_argument("--out", metavar="DIR", help="output directory (default RUN_DIR/report)")
    p.add_argument("--stall-ms", type=float, default=STALL_S * 1e3,
                   help="stall threshold in milliseconds (default %(default)g)")
    return p


def main(argv: Iterable[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status: 0, or
    2 when a run directory is missing or its metrics are unreadable, or 1 when the output's card
    does not match the output (:func:`card_error`), each with one line on stderr."""
    ap = parser()
    args = ap.parse_args(list(argv) if argv is not None else None)
    if not args.stall_ms > 0:
        ap.error("--stall-ms must be > 0")
    stall_s = args.stall_ms / 1e3
    out = Path(args.out) if args.out else Path(args.run_dir) / "report"
    try:
        report = write_report(args.run_dir, out, stall_s)
        print(f"report: {out} (report.json, timeline.png, latency.png, utilisation.png)")
        print(summary_text(report))
        if args.compare:
            labels = args.labels
            if labels is None:
                other = summarize_run(args.compare, stall_s)
                labels = (report["mode"], other["mode"])
                if labels[0] == labels[1]:
                    labels = (Path(args.run_dir).resolve().name, Path(args.compare).resolve().name)
                if labels[0] == labels[1]:
                    labels = ("a", "b")
            cmp = compare_reports(args.run_dir, args.compare, out, labels, stall_s)
            print(f"compare: {cmp['files']['compare']}, {cmp['files']['compare_png']}")
            r = cmp["ratios_b_over_a"]

            def fmt(x):
                return "-" if x is None else f"{x:.2f}x"

            print(f"{labels[1]} / {labels[0]}: output tok/s {fmt(r['output_tokens_per_s'])}, "
                  f"TTFT p99 {fmt(r['ttft_p99_s'])}, ITL p99 {fmt(r['itl_p99_s'])}, "
                  f"ITL max {fmt(r['itl_max_s'])}, stalls {fmt(r['stalls'])}")
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    wrong = card_error(args.run_dir)
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 1
    return 0


def card_error(run_dir: str | Path) -> str | None:
    """One line saying how the card of the run's output (:mod:`pipeline.report.card`) differs
    from the output shards, or cannot be read; None when they agree, or when there is no card
    (or no ``shards.json`` naming the output)."""
    import pyarrow as pa

    from pipeline.report.card import CARD_JSON, card_mismatches
    from pipeline.runtime.rundir import RunDir

    try:
        output = RunDir(run_dir).output_dir()
    except (OSError, ValueError, KeyError):
        return None
    try:
        wrong = card_mismatches(output)
    except (OSError, ValueError, ImportError, pa.ArrowException) as exc:  # ImportError: no fsspec driver
        return f"the output's card ({output}/{CARD_JSON}) cannot be checked: {one_line(exc)}"
    return (f"the output's card ({output}/{CARD_JSON}) does not match the output: {'; '.join(wrong)}"
            if wrong else None)
