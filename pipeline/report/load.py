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
    """A run's request metrics as the report reads them, in columns (issue #39: 10^6 requests of
    32 tokens in well under 1 GiB): ``table`` (pyarrow: every column but ``key``,
    ``token_times`` and :data:`UNUSED_COLUMNS`; worker and shard names dictionary-encoded) and,
    from the token times, numpy arrays: per request ``counts`` (tokens timed; a null list has
    none), ``first`` and ``last`` (its first and last token's time, NaN without) and
    ``max_gap`` (its longest gap between consecutive tokens, NaN under two tokens); and
    ``gaps``, every request's gaps pooled (their order is not kept: readers sort them in place).
    The token times themselves are not kept: :meth:`token_times_of` reads those of a few
    requests again (the timeline's)."""

    def __init__(self, table: Any, counts: Any, first: Any, last: Any, max_gap: Any, gaps: Any,
                 files: list[Path], file_of: Any, row_in_file: Any):
        self.table, self.counts, self.first, self.last, self.max_gap, self.gaps = (
            table, counts, first, last, max_gap, gaps)
        self.files, self.file_of, self.row_in_file = files, file_of, row_in_file

    def __len__(self) -> int:
        return self.table.num_rows

    def token_times_of(self, indices: Any) -> dict[int, Any]:
        """Request index -> its token times (numpy float64), for ``indices``: read again from
        their files, one file at a time (none for a request whose file is gone since)."""
        import numpy as np
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from pipeline.io.metrics import REQUEST_SCHEMA

        out: dict[int, Any] = {}
        idx = np.asarray(indices, dtype=np.int64)
        for f in np.unique(self.file_of[idx]):
            mine = idx[self.file_of[idx] == f]
            try:
                col = pq.read_table(self.files[f], schema=REQUEST_SCHEMA, columns=["token_times"]).column(0)
            except FileNotFoundError:  # merged by its worker since it was read: drawn without tokens
                continue
            rows = col.take(self.row_in_file[mine])
            for i, tt in zip(mine.tolist(), rows.to_pylist()):
                out[i] = np.asarray(tt if tt is not None else [], dtype=np.float64)
        return {i: out.get(i, np.zeros(0)) for i in idx.tolist()}


STRING_COLUMNS = ["shard", "prefill_worker", "decode_worker", "error"]

UNUSED_COLUMNS = ("row", "decode_arrived_at", "tries", "capacity_wait_s")
"""Request metrics columns no figure of the report uses (not read)."""

WORKER_COLUMNS = ["worker", "role", "t", "running", "kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits"]
"""The worker step columns the report reads (:data:`pipeline.io.metrics.WORKER_SCHEMA`)."""


def _token_stats(values: Any, counts: Any) -> tuple[Any, Any, Any, Any]:
    """Per request first and last token time and longest gap, and the pooled gaps, of token
    times ``values`` (numpy, all requests' in turn) of requests of ``counts`` tokens."""
    import numpy as np

    n = counts.size
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    has = counts > 0
    first, last, max_gap = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    first[has] = values[offsets[:-1][has]]
    last[has] = values[offsets[1:][has] - 1]
    if values.size < 2:
        return first, last, max_gap, np.zeros(0)
    keep = np.ones(values.size - 1, dtype=bool)
    ends = offsets[1:-1] - 1  # the last token of each request but the last: no gap after it
    keep[ends[(ends >= 0) & (ends < values.size - 1)]] = False
    gaps = np.diff(values)[keep]
    two = counts > 1
    if two.any():
        starts = np.concatenate([[0], np.cumsum(np.maximum(counts - 1, 0))])[:-1]
        max_gap[two] = np.maximum.reduceat(gaps, starts[two])
    return first, last, max_gap, gaps


def read_requests(run: Path) -> Requests:
    """:class:`Requests` of the run at ``run`` (see :func:`pipeline.io.metrics.request_metrics_files`),
    a file at a time; read again when a worker's merge removed a part meanwhile
    (:func:`pipeline.io.metrics.while_merging`).

    Raises:
        pyarrow.ArrowException, OSError, ValueError: a file cannot be read.
    """
    from pipeline.io.metrics import while_merging

    return while_merging(lambda: _read_requests(run))


def _read_requests(run: Path) -> Requests:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipeline.io.metrics import REQUEST_SCHEMA, concat_files, request_metrics_files

    keep = [f.name for f in REQUEST_SCHEMA if f.name not in ("key", "token_times") + UNUSED_COLUMNS]
    schema = pa.schema([REQUEST_SCHEMA.field(c).with_type(pa.dictionary(pa.int32(), pa.string()))
                        if c in STRING_COLUMNS[:3] else REQUEST_SCHEMA.field(c) for c in keep])
    files = request_metrics_files(run)
    # The gaps go straight into one array, sized from the files' footers (a list column's leaf
    # entries: at least its values, so at least the gaps), so they are never held twice.
    pooled = np.empty(sum(_token_entries(p) for p in files), dtype=np.float64)
    per_request, at = [], 0

    def read(path: Path) -> Any:  # a file's table less its token times, whose figures it keeps
        nonlocal pooled, at
        t = pq.read_table(path, schema=REQUEST_SCHEMA, columns=keep + ["token_times"])
        tt = t.column("token_times")
        counts = (np.concatenate([pc.fill_null(pc.list_value_length(c), 0).to_numpy(zero_copy_only=False)
                                  for c in tt.chunks]) if tt.num_chunks else np.zeros(0)).astype(np.int64)
        values = (np.concatenate([pc.list_flatten(c).to_numpy(zero_copy_only=False) for c in tt.chunks])
                  if tt.num_chunks else np.zeros(0)).astype(np.float64, copy=False)
        first, last, max_gap, gaps = _token_stats(values, counts)
        if at + gaps.size > pooled.size:  # a footer that undercounts: grow
            pooled = np.concatenate([pooled[:at], np.empty(at + gaps.size - pooled.size + pooled.size // 2)])
        pooled[at:at + gaps.size] = gaps
        at += gaps.size
        per_request.append((counts, first, last, max_gap, np.full(counts.size, len(per_request), np.int32),
                            np.arange(counts.size, dtype=np.int32)))
        return t.drop_columns(["token_times"]).cast(schema)

    table = concat_files(read, files) if files else schema.empty_table()
    cols = [np.concatenate(c) if per_request else np.zeros(0) for c in zip(*per_request)] if per_request \
        else [np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int32)]
    counts, first, last, max_gap, file_of, row_in_file = cols
    return Requests(table, counts, first, last, max_gap, pooled[:at], files, file_of, row_in_file)


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
        # One step a row: the names dictionary-encoded, read so (never as a string per step).
        workers = read_worker_metrics(run, WORKER_COLUMNS, dictionary=("worker", "role"))
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
