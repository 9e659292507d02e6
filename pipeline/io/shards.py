"""Input and output shards.

One Parquet dataset is many shard files; each input shard gives exactly one output shard with the
same base name. Paths are fsspec URLs or local paths (``/data``, ``file:///data``, ``s3://b/p``).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.atomic import url_to_fs

GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class Shard:
    """One input shard. ``index`` is its position in the sorted shard list; ``name`` its base
    file name (also the output shard's name)."""

    index: int
    url: str
    name: str




def _unstrip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return fs.unstrip_protocol(path) if fs.protocol not in ("file", ("file", "local")) else path


def list_shards(input_url: str) -> list[Shard]:
    """List the Parquet shards of ``input_url``: a directory (its ``*.parquet`` files), a glob,
    or one file. Sorted by path, so shard indices are stable between runs.

    Raises:
        FileNotFoundError: nothing exists at ``input_url`` or it holds no ``.parquet`` file.
    """
    fs, path = url_to_fs(input_url)
    if any(c in path for c in GLOB_CHARS):
        paths = sorted(p for p in fs.glob(path) if fs.isfile(p))
    elif fs.isdir(path):
        paths = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".parquet") and fs.isfile(p))
    elif fs.isfile(path):
        paths = [path]
    else:
        raise FileNotFoundError(f"job.input: no such file or directory: {input_url}")
    if not paths:
        raise FileNotFoundError(f"job.input: no .parquet shards in {input_url}")
    return [Shard(i, _unstrip(fs, p), posixpath.basename(p)) for i, p in enumerate(paths)]


def read_shard(shard: Shard) -> pa.Table:
    """Read a whole input shard (all columns)."""
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f)


def output_url(output_dir: str, shard: Shard) -> str:
    return posixpath.join(output_dir.rstrip("/"), shard.name)
