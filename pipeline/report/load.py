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


class Requests:
    """A run's request metrics as the report reads them, in columns: ``table`` (pyarrow, every
    column but ``key``, ``token_times`` and :data:`UNUSED_COLUMNS`; worker and shard names
    dictionary-encoded) and the
    token times apart, all requests' in one float64 array ``values`` (request i's are
    ``values[offsets[i]:offsets[i + 1]]``; a null list is empty). Read file by file, so that
    memory holds the columns once, not a Python object per value (issue #39: 10^6 requests of
    32 tokens)."""

    def __init__(self, table: Any, values: Any, offsets: Any):
        self.table, self.values, self.offsets = table, values, offsets

    def __len__(self) -> int:
        return self.table.num_rows

    def counts(self) -> Any:
        """Tokens timed per request (numpy int64)."""
        import numpy as np

        return np.diff(self.offsets)

    def token_times(self, i: int) -> Any:
        """Request ``i``'s token times (a numpy view)."""
        return self.values[self.offsets[i]:self.offsets[i + 1]]


STRING_COLUMNS = ["shard", "prefill_worker", "decode_worker", "error"]

UNUSED_COLUMNS = ("row", "decode_arrived_at", "tries", "capacity_wait_s")
"""Request metrics columns no figure of the report uses (not read)."""

WORKER_COLUMNS = ["worker", "role", "t", "running", "kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits"]
"""The worker step columns the report reads (:data:`pipeline.io.metrics.WORKER_SCHEMA`)."""


def read_requests(run: Path) -> Requests:
    """:class:`Requests` of the run at ``run`` (see :func:`pipeline.io.metrics.request_metrics_files`).

    Raises:
        pyarrow.ArrowException, OSError, ValueError: a file cannot be read.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipeline.io.metrics import REQUEST_SCHEMA, request_metrics_files

    keep = [f.name for f in REQUEST_SCHEMA if f.name not in ("key", "token_times") + UNUSED_COLUMNS]
    schema = pa.schema([REQUEST_SCHEMA.field(c).with_type(pa.dictionary(pa.int32(), pa.string()))
                        if c in STRING_COLUMNS[:3] else REQUEST_SCHEMA.field(c) for c in keep])
    files = request_metrics_files(run)
    # The token times go straight into one array, sized from the files' footers (a list
    # column's leaf entries: at least its values), so they are never held twice.
    flat = np.empty(sum(_token_entries(p) for p in files), dtype=np.float64)
    tables, lengths, at = [], [], 0
    for path in files:
        t = pq.read_table(path, schema=REQUEST_SCHEMA, columns=keep + ["token_times"])
        for chunk in t.column("token_times").chunks:
            lengths.append(pc.fill_null(pc.list_value_length(chunk), 0).to_numpy(zero_copy_only=False))
            v = pc.list_flatten(chunk).to_numpy(zero_copy_only=False)
            if at + v.size > flat.size:  # a footer that undercounts: grow
                flat = np.concatenate([flat[:at], np.empty(at + v.size - flat.size + flat.size // 2)])
            flat[at:at + v.size] = v
            at += v.size
        tables.append(t.drop_columns(["token_times"]).cast(schema))
        del t
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    del tables
    counts = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return Requests(table, flat[:at], offsets)


def _token_entries(path: Path) -> int:
    """Leaf entries of ``token_times`` in a request metrics file, from its footer (0 without)."""
    import pyarrow.parquet as pq

    md = pq.read_metadata(path)
    cols = [i for i in range(md.num_columns) if md.schema.column(i).path.startswith("token_times.")]
    return sum(md.row_group(g).column(i).num_values for g in range(md.num_row_groups) for i in cols)


def load_run(run_path: str | Path) -> tuple[Requests, Any, dict[str, Any] | None]:
    """The run's requests (:class:`Requests`), worker table (pyarrow) and ``summary.json`` (or
    None when absent or unreadable).

    Raises:
        FileNotFoundError: the directory does not exist, or holds no request metrics.
        ValueError: the metrics files cannot be read, or hold no rows.
    """
    import pyarrow as pa

    from pipeline.io.metrics import read_worker_metrics, request_metrics_files

    run = Path(run_path)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory not found: {run}")
    req_dir = run / "metrics" / "requests"
    try:
        files = request_metrics_files(run)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ValueError(f"unreadable request metrics in {req_dir}: {one_line(exc)}") from None
    if not files:
        raise FileNotFoundError(f"no request metrics in {req_dir} (not a run directory, or no row "
                                f"was served yet)")
    try:
        requests = read_requests(run)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable request metrics in {req_dir}: {one_line(exc)}") from None
    if len(requests) == 0:
        raise ValueError(f"request metrics in {req_dir} hold no rows")
    try:
        workers = read_worker_metrics(run, WORKER_COLUMNS)
        names = pa.dictionary(pa.int32(), pa.string())  # one step a row: the names once each
        workers = workers.cast(pa.schema([f.with_type(names) if f.name in ("worker", "role") else f
                                          for f in workers.schema]))
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
    return requests, workers, summary
