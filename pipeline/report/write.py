"""One run's report on disk: ``report.json`` and its PNGs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.io.atomic import atomic_write
from pipeline.report.load import load_run
from pipeline.report.plots import plot_latency, plot_timeline, plot_utilisation
from pipeline.report.pools import plot_pools, rows_by_worker
from pipeline.report.summary import STALL_S, latencies, run_start, summarize


def write_report(run_path: str | Path, out_dir: str | Path | None = None,
                 stall_s: float = STALL_S) -> dict[str, Any]:
    """Write ``report.json``, ``timeline.png``, ``latency.png`` and ``utilisation.png`` (and, for
    a disaggregated run, ``pools.png``: :mod:`pipeline.report.pools`) for the run in
    ``run_path`` into ``out_dir`` (default ``RUN_DIR/report/``).

    ``stall_s``: the stall threshold in seconds (an ITL gap longer than this is a stall).
    Returns the content of ``report.json``: :func:`pipeline.report.summary.summarize_run`'s
    keys plus ``timeline_rows`` (request rows drawn in the timeline), ``timeline_subsampled``,
    ``rows_by_worker`` (:func:`pipeline.report.pools.rows_by_worker`) and ``files`` (name -> path).

    Raises:
        FileNotFoundError: no such directory, or no request metrics in it.
        ValueError: unreadable metrics, or no rows.
    """
    run = Path(run_path)
    cols, workers, run_summary = load_run(run)
    out = Path(out_dir) if out_dir is not None else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    report = summarize(run, cols, workers, run_summary, stall_s)
    start = run_start(cols, workers)
    files = {name: out / f"{name}.png" for name in ("timeline", "latency", "utilisation")}
    report["timeline_rows"] = plot_timeline(cols, files["timeline"], stall_s, start)
    report["timeline_subsampled"] = report["timeline_rows"] < report["requests"]
    plot_latency(latencies(cols), files["latency"], stall_s)
    plot_utilisation(workers, files["utilisation"], start)
    report["rows_by_worker"] = rows_by_worker(cols)
    if report["rows_by_worker"]:  # disaggregated: how each worker's rows were served, over time
        files["pools"] = out / "pools.png"
        plot_pools(cols, files["pools"], start)
    files = {"report": out / "report.json", **files}
    report["files"] = {k: str(v) for k, v in files.items()}
    write_json(files["report"], report)
    return report


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as strict JSON (no NaN or infinity), indented by one space and ending in a
    newline, atomically (:func:`pipeline.io.atomic.atomic_write`)."""
    with atomic_write(path, "w") as f:
        f.write(json.dumps(data, indent=1, allow_nan=False) + "\n")
