"""Reading a run directory for its report: the request and worker metrics tables and the
launcher's ``summary.json``, with a one-line error when they are missing or unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name when the message is empty)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_run(run_path: str | Path) -> tuple[dict[str, Any], Any, dict[str, Any] | None]:
    """The run's request table (as a dict of columns: Python lists), worker table (pyarrow) and
    ``summary.json`` (or None when absent or unreadable).

    Raises:
        FileNotFoundError: the directory does not exist, or holds no request metrics.
        ValueError: the metrics files cannot be read, or hold no rows.
    """
    import pyarrow as pa

    from pipeline.io.metrics import read_request_metrics, read_worker_metrics
    from pipeline.io.shards import run_files

    run = Path(run_path)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory not found: {run}")
    req_dir = run / "metrics" / "requests"
    if not run_files(req_dir, "part-*.parquet", recursive=True):
        raise FileNotFoundError(f"no request metrics in {req_dir} (not a run directory, or no row "
                                f"was served yet)")
    try:
        requests = read_request_metrics(run)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable request metrics in {req_dir}: {one_line(exc)}") from None
    if requests.num_rows == 0:
        raise ValueError(f"request metrics in {req_dir} hold no rows")
    try:
        workers = read_worker_metrics(run)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable worker metrics in {run / 'metrics' / 'workers'}: "
                         f"{one_line(exc)}") from None
    summary = None
    try:
        summary = json.loads((run / "summary.json").read_text())
        if not isinstance(summary, dict):
            summary = None
    except (OSError, ValueError):
        pass
    return requests.to_pydict(), workers, summary
