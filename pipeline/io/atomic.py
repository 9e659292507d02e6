"""The one way pd-pipeline writes a file: readers see either nothing or the whole file.

Every file a run writes (output shards, row checkpoints, metrics parts, done markers, endpoints,
progress, RAG index batches) goes through :func:`atomic_write`: the bytes go to a hidden
temporary name in the same directory, which is then moved into place (an atomic rename on a
local or POSIX file system; on object stores the upload itself is atomic). A write that fails
removes its temporary file, so a failed write leaves nothing behind.

Temporary names are ``.<name>.<8 hex>.tmp`` cut so that they never exceed the file system's
255-byte name limit, whatever the length of the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import fsspec

NAME_MAX = 255  # bytes in one path component (Linux, macOS, S3 keys allow more)


def url_to_fs(url: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec file system and path of a URL or local path."""
    return fsspec.core.url_to_fs(str(url))


def temporary_name(name: str) -> str:
    """A hidden temporary name for ``name`` in the same directory, at most :data:`NAME_MAX`
    bytes long (the final name is shortened inside it when needed)."""
    suffix = f".{uuid.uuid4().hex[:8]}.tmp"
    room = NAME_MAX - 1 - len(suffix.encode())
    stem = name.encode()[:room].decode("utf-8", "ignore")
    return f".{stem}{suffix}"


@contextlib.contextmanager
def atomic_write(url: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``url`` for writing (``mode`` ``"wb"`` or ``"w"``); when the
    ``with`` block ends without an exception, move it to ``url``. The parent directory is
    created. On an exception the temporary file is removed and the exception propagates.

    Raises:
        OSError: the directory cannot be created or written, or the move failed.
    """
    fs, path = url_to_fs(url)
    parent = posixpath.dirname(path)
    fs.makedirs(parent, exist_ok=True)
    tmp = posixpath.join(parent, temporary_name(posixpath.basename(path)))
    try:
        with fs.open(tmp, mode) as f:
            yield f
        fs.mv(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            if fs.exists(tmp):
                fs.rm(tmp)


def write_json(url: str | os.PathLike, data: Any, sort_keys: bool = False) -> None:
    """Write ``data`` as JSON (indented by one space) atomically."""
    with atomic_write(url, "w") as f:
        json.dump(data, f, indent=1, sort_keys=sort_keys)


def write_parquet(table: Any, url: str | os.PathLike) -> None:
    """Write a ``pyarrow.Table`` as one Parquet file atomically."""
    import pyarrow.parquet as pq

    with atomic_write(url) as f:
        pq.write_table(table, f)


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file written by :func:`write_json` (a local path)."""
    return json.loads(Path(path).read_text())
