"""Input and output shards.

One input dataset is many shard files; each input shard gives exactly one output shard. A shard
is named by its path relative to the input root (``lang=en/part-0.parquet``): that name is its
output file under ``job.output``, its done marker, its checkpoints and its metrics, so shards with
the same base name in different folders stay apart and the input's layout (hive partition keys
included) is kept. Paths are fsspec URLs or local paths (``/data``, ``file:///data``, ``s3://b/p``).

A shard is Parquet, JSON Lines (``.jsonl``, ``.json``, ``.ndjson``) or CSV (``.csv``), each file
by its extension (:mod:`pipeline.io.formats`); a JSON Lines file whose first valid line is an
OpenAI batch request is read as an OpenAI batch file (:mod:`pipeline.io.openai_batch`). Its
output shard is Parquet whatever its format: the shard's name with its extension replaced by
``.parquet`` (an OpenAI batch file also gets a ``.jsonl`` beside it).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import formats
from pipeline.io.atomic import NAME_MAX, url_to_fs
from pipeline.io.openai_batch import REQUEST_SCHEMA, is_request, request_batch
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


class UnreadExtension(ValueError):
    """An input file named with an extension the pipeline does not read (:func:`list_shards`)."""


def _refuse_extension(input_url: str, paths: list[str]) -> None:
    """Raise :class:`UnreadExtension` for ``paths``, files whose extensions are not read."""
    exts = ", ".join(sorted({formats.unread_extension(p) or "" for p in paths}))
    raise UnreadExtension(f"job.input: {input_url}: {exts} files are not read; the pipeline reads "
                     f"{formats.READ} (convert the file, or rename it if it is one of these)")


def list_shards(input_url: str) -> list[Shard]:
    """List the shards of ``input_url``: a directory (every ``*.parquet``, ``*.jsonl``,
    ``*.json``, ``*.ndjson`` and ``*.csv`` file below it, found by ``pyarrow.dataset``
    discovery, hidden ``.``/``_`` files skipped), a glob (names relative to the glob's fixed
    leading directory; matches with another extension are left out, as in a directory), or one
    file (named by its base name; read by its extension, Parquet when it has none). Sorted by
    path, so shard indices are stable between runs.

    Raises:
        FileNotFoundError: nothing exists at ``input_url`` or it holds no shard.
        UnreadExtension: a file named (or every file a glob matches) has an extension that is not
            read (``docs.txt``, ``docs.tsv``): it is not read as Parquet.
    """
    import pyarrow.dataset as ds

    fs, path = url_to_fs(input_url)
    path = path.rstrip("/") or "/"
    if any(c in path for c in GLOB_CHARS):
        root = _glob_root(path)
        paths = [p for p in fs.glob(path) if fs.isfile(p)]
        if paths and all(formats.unread_extension(p) for p in paths):
            _refuse_extension(input_url, paths)
        paths = [p for p in paths if not formats.unread_extension(p)]
    elif fs.isdir(path):
        root = path
        # An explicit (empty) schema: discovery only, no file is opened here.
        found = ds.dataset(path, filesystem=fs, format="parquet", schema=pa.schema([]))
        paths = [p for p in found.files if formats.file_format(p)]
    elif fs.isfile(path):
        if formats.unread_extension(path):
            _refuse_extension(input_url, [path])
        root, paths = posixpath.dirname(path), [path]
    else:
        raise FileNotFoundError(f"job.input: no such file or directory: {input_url}")
    named = sorted((posixpath.relpath(p, root), p) for p in paths)
    named = [(name, p) for name, p in named if not _hidden(name)]
    if not named:
        raise FileNotFoundError(f"job.input: no .parquet shards (nor .jsonl, .json, .ndjson or .csv files) in {input_url}")
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


def run_files(base: Path, pattern: str, *, recursive: bool = False) -> list[Path]:
    """The run's own files under ``base`` whose names match ``pattern`` (sorted; with
    ``recursive``, in every folder below): files only, never a temporary (hidden) one.

    Folders under a run directory are named after the user's shards (:func:`shard_path`), and a
    shard may be named like the run's own files (``part-0.parquet``, ``x.json``): a glob that
    also returns folders reads such a shard's folder as one more file or dataset (a run over
    ``part-*.parquet`` shards once reported every request twice). Every reader of the run
    directory lists through here."""
    found = base.rglob(pattern) if recursive else base.glob(pattern)
    return sorted(p for p in found if not p.name.startswith(".") and p.is_file())


def read_shard(shard: Shard) -> pa.Table:
    """Read a whole input shard (all columns); for small tables only (the RAG corpus): shard
    owners stream their shards with :func:`iter_batches`."""
    if shard_format(shard) == "parquet":
        fs, path = url_to_fs(shard.url)
        with fs.open(path, "rb") as f:
            return pq.read_table(f)
    return pa.Table.from_batches([b for _, b in iter_batches(shard, 65536)], schema=shard_schema(shard))


def output_name(name: str) -> str:
    """The output shard's name for input shard ``name``: its extension replaced by
    ``.parquet`` (``a/b.jsonl`` -> ``a/b.parquet``)."""
    if formats.file_format(name) in (None, "parquet"):
        return name
    return name[:name.rfind(".")] + ".parquet"


def output_url(output_dir: str, shard: Shard) -> str:
    """Where ``shard``'s output goes: its relative path under ``output_dir``, as Parquet
    (:func:`output_name`)."""
    return posixpath.join(output_dir.rstrip("/"), output_name(shard.name))


def batch_output_url(output_dir: str, shard: Shard) -> str:
    """Where an OpenAI batch file's output lines go: beside its output shard, ``.jsonl``."""
    return output_url(output_dir, shard).removesuffix(".parquet") + ".jsonl"


def output_clashes(shards: list[Shard]) -> list[tuple[str, str, str]]:
    """(shard, other shard, the output name both would write) for shards whose output names
    meet (``a/b.jsonl`` and ``a/b.parquet``)."""
    first: dict[str, str] = {}
    out = []
    for s in shards:
        name = output_name(s.name)
        if name in first:
            out.append((first[name], s.name, name))
        first.setdefault(name, s.name)
    return out


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


@functools.lru_cache(maxsize=4096)
def _sniff(url: str) -> str:
    """``openai_batch`` when the first line of the JSON Lines file at ``url`` that is a JSON
    value (within its first :data:`~pipeline.io.formats.HEAD_ROWS` lines) is an OpenAI batch
    request (:func:`~pipeline.io.openai_batch.is_request`), else ``jsonl``."""
    fs, path = url_to_fs(url)
    with fs.open(path, "rb") as f:
        for _, value in itertools.islice(formats.json_lines(f), formats.HEAD_ROWS):
            if not isinstance(value, str):  # a string is why the line does not parse
                return "openai_batch" if is_request(value) else "jsonl"
    return "jsonl"


def shard_format(shard: Shard) -> str:
    """How the shard is read: ``parquet``, ``jsonl``, ``openai_batch`` or ``csv`` (see the
    module's docstring); JSON Lines files are opened to tell plain rows from batch requests."""
    fmt = formats.file_format(shard.name) or "parquet"
    return _sniff(shard.url) if fmt == "jsonl" else fmt


def _text_batches(fmt: str, f, rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and record batches of a JSON Lines, OpenAI batch or CSV shard open as ``f``."""
    if fmt == "openai_batch":
        return REQUEST_SCHEMA, (request_batch(c) for c in formats.chunks(formats.json_lines(f), rows))
    return (formats.csv_batches if fmt == "csv" else formats.json_batches)(f, rows)


def shard_schema(shard: Shard) -> pa.Schema:
    """The shard's Arrow schema: Parquet's from its footer (no row data is read); JSON Lines and
    CSV from the file's first rows (:mod:`pipeline.io.formats`); an OpenAI batch file's is
    :data:`~pipeline.io.openai_batch.REQUEST_SCHEMA`."""
    fmt = shard_format(shard)
    if fmt == "openai_batch":
        return REQUEST_SCHEMA
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).schema_arrow if fmt == "parquet" else _text_batches(fmt, f, 1)[0]


def shard_rows(shard: Shard) -> int:
    """The shard's rows: Parquet's from its footer; JSON Lines and CSV by reading the file
    through once (:func:`pipeline.io.formats.count_rows`)."""
    fmt = shard_format(shard)
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows if fmt == "parquet" else formats.count_rows(fmt, f)


def iter_batches(shard: Shard, rows: int, columns: list[str] | None = None,
                 row_groups: tuple[int, int] | None = None, first_row: int = 0) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The shard's rows (``columns``, default all) as ``(first row index, record batch)`` of at
    most ``rows`` rows each, read one batch at a time (memory holds one batch, not the shard).
    ``row_groups`` (Parquet): only ``groups`` row groups from ``first``, whose first row is
    ``first_row`` (a unit of a split shard, :mod:`pipeline.io.units`). JSON Lines and CSV shards
    are parsed whole and their batches cut to ``columns``."""
    fmt = shard_format(shard)
    fs, path = url_to_fs(shard.url)
    with fs.open(path, "rb") as f:
        if fmt == "parquet":
            groups = None if row_groups is None else list(range(row_groups[0], row_groups[0] + row_groups[1]))
            batches = pq.ParquetFile(f).iter_batches(batch_size=rows, columns=columns, row_groups=groups)
        else:
            batches = (b.select(columns) if columns is not None else b for b in _text_batches(fmt, f, rows)[1])
        first = first_row
        for batch in batches:
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
