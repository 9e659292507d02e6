"""A report checked against the output it describes.

The report's counts come from the request metrics (``RUN_DIR/metrics/requests``: one record per
row served by an engine, written with each checkpoint batch). The output shards hold the same rows
as the user reads them. For every shard that is done, the rows served without an error must agree
in number, prompt tokens and output tokens; rows with an error are counted apart, since a row
refused before it reached an engine (a line that is not JSON, a duplicate id) has no request
metrics, so the metrics may hold fewer errors than the output but never more. A reader that
counts a file twice or misses one (a run over shards named ``part-*.parquet`` once reported every
request twice) shows up as a mismatch, which the report prints as an error instead of its figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.io.shards import output_name
from pipeline.runtime.rundir import RunDir

COLUMNS = ["error", "prompt_tokens", "output_tokens"]


def _counts(table: Any) -> dict[str, int]:
    """Rows without an error (``requests``) and their prompt and output tokens, and rows with
    one (``errors``), of a table with :data:`COLUMNS`."""
    import pyarrow.compute as pc

    served = table.filter(pc.is_null(table.column("error")))
    return {"requests": served.num_rows,
            "prompt_tokens": int(pc.sum(served.column("prompt_tokens")).as_py() or 0),
            "output_tokens": int(pc.sum(served.column("output_tokens")).as_py() or 0),
            "errors": table.num_rows - served.num_rows}


def check_against_output(run: Path, cols: Any) -> dict[str, Any]:
    """The request metrics ``cols`` (:class:`pipeline.report.load.Requests`, as
    :func:`pipeline.report.load.load_run` reads them) against the output shards of the shards
    done in ``run``. Returns ``{"shards": number of output shards read, "mismatches": ["requests
    4000 in the request metrics, 2000 in the output", ...]}`` (``requests``, ``prompt_tokens``
    and ``output_tokens`` of the rows without an error; ``errors`` only when the metrics hold
    more), and ``"unreadable"`` (why) when the output could not be read, in which case nothing
    was compared. A run in progress is compared on its finished shards only. Each output shard
    is read for its three columns and counted, one at a time."""
    import fsspec
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rundir = RunDir(run)
    done = rundir.done()
    if not done:
        return {"shards": 0, "mismatches": []}
    want = dict.fromkeys(("requests", "prompt_tokens", "output_tokens", "errors"), 0)
    try:
        out_dir = rundir.output_dir().rstrip("/")
        for name in done:
            with fsspec.open(f"{out_dir}/{output_name(name)}", "rb") as f:
                for k, v in _counts(pq.read_table(f, columns=COLUMNS)).items():
                    want[k] += v
    except (OSError, ValueError, KeyError) as exc:  # moved, deleted or unreachable; an old run dir
        return {"shards": 0, "mismatches": [], "unreadable": f"{type(exc).__name__}: {exc}"}
    table = cols.table.select(["shard", *COLUMNS])
    mine = pc.is_in(table.column("shard").cast(pa.string()), value_set=pa.array(list(done), pa.string()))
    got = _counts(table.filter(mine))
    mismatches = [f"{key.replace('_', ' ')} {got[key]} in the request metrics, {want[key]} in the output"
                  for key in ("requests", "prompt_tokens", "output_tokens") if got[key] != want[key]]
    if got["errors"] > want["errors"]:
        mismatches.append(f"errors {got['errors']} in the request metrics, {want['errors']} in the output")
    return {"shards": len(done), "mismatches": mismatches}
