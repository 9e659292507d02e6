"""Input and output shards.

One input dataset is many shard files; each input shard gives exactly one output shard. A shard
is named by its path relative to the input root (``lang=en/part-0.parquet``): that name is its
output file under ``job.output``, its done marker, its checkpoints and its metrics, so shards with
the same base name in different folders stay apart and the input's layout (hive partition keys
included) is kept. Paths are fsspec URLs or local paths (``/data``, ``file:///data``, ``s3://b/p``).
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.atomic import NAME_MAX, url_to_fs
from pipeline.io.output import ids_as_keys

GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class Shard:
    """One input shard. ``index`` is its position in the sorted shard list; ``name`` its path
    relative to the input root (POSIX separators; also the output shard's relative path)."""

    index: int
    url: str
    name: str


def _unstrip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return fs.unstrip_protocol(path) if fs.protocol not in ("file", ("file", "local")) else path


def _hidden(relpath: str) -> bool:
    """Whether any component starts with ``.`` or ``_`` (temporary files, ``_SUCCESS``,
    ``_metadata``): pyarrow.dataset's own default ``ignore_prefixes``."""
    return any(part.startswith((".", "_")) for part in relpath.split("/"))


def _glob_root(path: str) -> str:
    """The directory part of a glob before its first wildcard: ``/in/*/part-*.parquet`` -> ``/in``."""
    parts = path.split("/")
    static = next(i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARS))
    return "/".join(parts[:static])


def list_shards(input_url: str) -> list[Shard]:
    """List the Parquet shards of ``input_url``: a directory (every ``*.parquet`` file below it,
    found by ``pyarrow.dataset`` discovery, hidden ``.``/``_`` files skipped), a glob (names
    relative to the glob's fixed leading directory), or one file (named by its base name).
    Sorted by path, so shard indices are stable between runs.

    Raises:
        FileNotFoundError: nothing exists at ``input_url`` or it holds no ``.parquet`` file.
    """
    import pyarrow.dataset as ds

    fs, path = url_to_fs(input_url)
    path = path.rstrip("/") or "/"
    if any(c in path for c in GLOB_CHARS):
        root = _glob_root(path)
        paths = [p for p in fs.glob(path) if fs.isfile(p)]
    elif fs.isdir(path):
        root = path
        # An explicit (empty) schema: discovery only, no file is opened here.
        found = ds.dataset(path, filesystem=fs, format="parquet", schema=pa.schema([]))
        paths = [p for p in found.files if p.endswith(".parquet")]
    elif fs.isfile(path):
        root, paths = posixpath.dirname(path), [path]
    else:
        raise FileNotFoundError(f"job.input: no such file or directory: {input_url}")
    named = sorted((posixpath.relpath(p, root), p) for p in paths)
    named = [(name, p) for name, p in named if not _hidden(name)]
    if not named:
        raise FileNotFoundError(f"job.input: no .parquet shards in {input_url}")
    return [Shard(i, _unstrip(fs, p), name) for i, (name, p) in enumerate(named)]


def shard_path(base: Path, name: str, suffix: str = "") -> Path:
    """``base / name + suffix`` for a run-directory file about shard ``name`` (done marker,
    checkpoint folder, metrics folder): the shard's folders are kept, and a last component that
    ``suffix`` would push past the file system's 255-byte limit is shortened, with a hash of
    the whole name so that two long names never meet."""
    *folders, last = name.split("/")
    leaf = last + suffix
    if len(leaf.encode()) > NAME_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        room = NAME_MAX - len(suffix.encode()) - len(digest) - 1
        leaf = f"{last.encode()[:room].decode('utf-8', 'ignore')}~{digest}{suffix}"
    return Path(base, *folders, leaf)


def read_shard(shard: Shard) -> pa.Table:
    """Read a whole input shard (all columns); for small tables only (the RAG corpus): shard
    owners stream their shards with :func:`iter_batches`."""
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f)


def output_url(output_dir: str, shard: Shard) -> str:
    """Where ``shard``'s output goes: its relative path under ``output_dir``."""
    return posixpath.join(output_dir.rstrip("/"), shard.name)


def output_files(output_dir: str) -> list[str]:
    """The output shards under ``output_dir`` (recursively, hidden files skipped), sorted."""
    fs, path = url_to_fs(output_dir)
    if not fs.isdir(path):
        return []
    files = [p for p in fs.find(path) if p.endswith(".parquet")]
    return sorted(_unstrip(fs, p) for p in files if not _hidden(posixpath.relpath(p, path)))


def read_output(output_dir: str):
    """A run's output shards as one ``pyarrow.dataset.Dataset`` whose schema is the union of the
    shards' schemas (shards whose inputs had different columns get nulls in the others), with
    hive partition keys in the shards' paths (``lang=en/...``) as columns when no shard has a
    column of that name.

    Raises:
        FileNotFoundError: no output shard there.
    """
    import pyarrow.dataset as ds

    files = output_files(output_dir)
    if not files:
        raise FileNotFoundError(f"no output shards (*.parquet) in {output_dir}")
    fs, root = url_to_fs(output_dir)
    local = [url_to_fs(f)[1] for f in files]
    schema = pa.unify_schemas([pq.read_schema(f, filesystem=fs) for f in local], promote_options="permissive")
    keys = {part.split("=", 1)[0] for f in local for part in posixpath.relpath(f, root).split("/")[:-1] if "=" in part}
    partitioning = None
    if keys and not keys & set(schema.names):
        partitioning = ds.partitioning(pa.schema([(k, pa.string()) for k in sorted(keys)]), flavor="hive")
        schema = pa.unify_schemas([schema, partitioning.schema])
    return ds.dataset(local, schema=schema, filesystem=fs, format="parquet", partitioning=partitioning,
                      partition_base_dir=root)


def shard_schema(shard: Shard) -> pa.Schema:
    """The shard's Arrow schema, from its Parquet footer (no row data is read)."""
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).schema_arrow


def iter_batches(shard: Shard, rows: int, columns: list[str] | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The shard's rows (``columns``, default all) as ``(first row index, record batch)`` of at
    most ``rows`` rows each, read one batch at a time (memory holds one batch, not the shard)."""
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        first = 0
        for batch in pq.ParquetFile(f).iter_batches(batch_size=rows, columns=columns):
            yield first, batch
            first += batch.num_rows


def text_values(batch: pa.RecordBatch | pa.Table, column: str) -> list[Any]:
    """The Python values of ``column``, string columns as ``bytes``: Parquet does not check that
    a string column holds UTF-8, and decoding each value later (``as_text``) makes a bad value
    one row's error instead of the shard's."""
    values = batch.column(column)
    if pa.types.is_string(values.type):
        values = values.cast(pa.binary())
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    return values.to_pylist()


def _id_values(batch: pa.RecordBatch) -> list[Any]:
    """A batch's ids (its one column) as hashable Python values: nested ids as their JSON text
    (:func:`pipeline.io.output.ids_as_keys`), strings as bytes (they may not be UTF-8)."""
    keys = ids_as_keys(batch.column(0))
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.large_binary())
    return keys.to_pylist()


def duplicate_id_rows(shard: Shard, id_column: str, rows: int = 65536) -> dict[int, str]:
    """Rows whose id (``id_column``) was seen earlier in the shard, each with its error:
    ``duplicate id 'x' (first at row N)``. Empty when the shard has no such column.

    Reads the id column only, ``rows`` at a time, twice: the first pass keeps one 64-bit hash
    per row (8 bytes a row: 8 MB for a million rows) and finds the rows whose hash repeats; the
    second compares those rows' ids themselves. Ids of a nested type are compared by their JSON
    text (:func:`pipeline.io.output.ids_as_keys`), strings by their bytes.
    """
    import numpy as np

    schema = shard_schema(shard)
    if id_column not in schema.names:
        return {}
    hashes: list[np.ndarray] = []
    for _, batch in iter_batches(shard, rows, [id_column]):
        hashes.append(np.fromiter((hash(v) for v in _id_values(batch)), np.int64, batch.num_rows))
    h = np.concatenate(hashes) if hashes else np.empty(0, np.int64)
    order = np.argsort(h, kind="stable")
    repeat = np.flatnonzero(h[order][1:] == h[order][:-1])
    candidates = set(order[repeat].tolist()) | set(order[repeat + 1].tolist())
    if not candidates:
        return {}
    first: dict[Any, int] = {}
    out = {}
    for start, batch in iter_batches(shard, rows, [id_column]):
        values = _id_values(batch)
        for row in sorted(r for r in candidates if start <= r < start + batch.num_rows):
            value = values[row - start]
            if value not in first:
                first[value] = row
                continue
            shown = value.decode("utf-8", "replace") if isinstance(value, bytes) and not (
                pa.types.is_binary(schema.field(id_column).type)
                or pa.types.is_large_binary(schema.field(id_column).type)) else value
            out[row] = f"duplicate id {shown!r} (first at row {first[value]})"
    return out
