"""Rebuild the sample prompt shards in ``data/sample/`` from the Python standard library.

The documents are the module docstrings of 24 standard-library modules, written by the CPython
developers and distributed under the Python Software Foundation License. Each docstring is cut at
a paragraph boundary to at most ``MAX_CHARS`` characters so a CPU run stays quick.

    python tools/make_sample_data.py [OUT_DIR]

Writes 3 shards of 8 rows: columns ``id`` (string), ``module`` (string, passed through),
``chars`` (int64, passed through) and ``text`` (string). Docstrings change a little between
Python releases; the shards in the repository were built with the Python named in
``data/sample/SOURCE.md``.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MODULES = [
    "argparse", "ast", "collections", "configparser", "copy", "csv", "difflib", "doctest",
    "fileinput", "hashlib", "heapq", "inspect", "io", "itertools", "json", "random",
    "re", "sched", "shelve", "socketserver", "statistics", "subprocess", "timeit", "unittest",
]
ROWS_PER_SHARD = 8
MAX_CHARS = 1200


def clip(text: str, limit: int = MAX_CHARS) -> str:
    """Cut ``text`` after the last whole paragraph that fits in ``limit`` characters."""
    if len(text) <= limit:
        return text
    paragraphs, out = text.split("\n\n"), ""
    for p in paragraphs:
        if len(out) + len(p) + 2 > limit:
            break
        out = f"{out}\n\n{p}" if out else p
    return out or text[:limit]


def build(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in MODULES:
        doc = clip(inspect.getdoc(importlib.import_module(name)) or "")
        rows.append({"id": f"stdlib-{name}", "module": name, "chars": len(doc), "text": doc})
    paths = []
    for i in range(0, len(rows), ROWS_PER_SHARD):
        path = out_dir / f"part-{i // ROWS_PER_SHARD:05d}.parquet"
        # Two row groups per shard, so that a run with job.unit_rows=4 serves each shard in two
        # parts (the tests' colocated reference does).
        pq.write_table(pa.Table.from_pylist(rows[i : i + ROWS_PER_SHARD]), path, row_group_size=ROWS_PER_SHARD // 2)
        paths.append(path)
    return paths


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "data" / "sample"
    for p in build(out):
        print(p)
