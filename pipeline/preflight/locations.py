"""Preflight: the places a run reads and writes (fsspec URLs or local paths)."""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid

import fsspec
from fsspec.registry import known_implementations

from pipeline.config import ConfigError
from pipeline.io.atomic import url_to_fs
from pipeline.io.shards import Shard, UnreadExtension, list_shards, output_url


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def filesystem(key: str, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec file system and path of ``url``.

    Raises:
        ConfigError: ``key``: the URL scheme's fsspec implementation is not installed (naming
            the package, such as s3fs for ``s3://``), or fsspec knows no such scheme.
    """
    try:
        return url_to_fs(url)
    except ImportError:
        protocol = url.split("::")[-1].split("://", 1)[0]
        package = known_implementations.get(protocol, {}).get("class", "").split(".")[0]
        raise ConfigError(f"{key}: {url} needs the fsspec implementation for {protocol}://, which is not "
                          f"installed (pip install {package or 'the package that provides it'})") from None
    except ValueError as exc:
        raise ConfigError(f"{key}: {url}: {exc}") from None


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "file" in protocols or "local" in protocols


def location(fs: fsspec.AbstractFileSystem, path: str) -> tuple[str, str]:
    """(file system, normalised absolute path): two spellings of one place compare equal."""
    if _is_local(fs):
        return "file", os.path.realpath(path)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol, path.rstrip("/")


def _inside(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """``a`` is ``b`` or lies inside it."""
    return a[0] == b[0] and (a[1] == b[1] or a[1].startswith(b[1].rstrip("/") + "/"))


def input_root(path: str) -> str:
    """A glob's fixed leading folder (``/in/*/p-*.parquet`` -> ``/in``); any other path itself."""
    cut = min((path.find(c) for c in "*?[" if c in path), default=-1)
    return path if cut < 0 else path[:cut].rsplit("/", 1)[0]


def list_input(url: str, key: str = "job.input") -> list[Shard]:
    """The shards at ``url`` (:func:`pipeline.io.shards.list_shards`).

    Raises:
        ConfigError: ``key``: nothing there, no Parquet file there, a file named with an extension
            that is not read (``docs.txt``), or it cannot be reached or listed.
    """
    try:
        return list_shards(url)
    except (FileNotFoundError, UnreadExtension) as exc:
        message = one_line(exc)
        raise ConfigError(message if message.startswith(f"{key}:") else
                          f"{key}: {message.removeprefix('job.input: ')}") from None
    except Exception as exc:  # noqa: BLE001 -- permission, network, credentials ...: one line
        raise ConfigError(f"{key}: cannot list {url}: {one_line(exc)}") from None


def check_overlap(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]], where: dict,
                   shards: list[Shard], output: str) -> None:
    """No output location is, or lies inside, an input location (a glob's: its fixed leading
    folder), and no output shard of ``shards`` under ``output`` would be written over an input
    shard. ``inputs`` / ``outputs``: (setting, URL); ``where``: setting -> (file system, path).

    Raises:
        ConfigError: naming the output setting and the input it would land in.
    """
    for out_key, out_url in outputs:
        out = location(*where[out_key])
        for in_key, in_url in inputs:
            fs, path = where[in_key]
            if _inside(out, location(fs, input_root(path))):
                raise ConfigError(f"{out_key}: {out_url} is or lies inside the input location {in_key}={in_url}; "
                                  f"choose an output outside the input")
    fs, _ = where["job.output"]
    inputs_at = {location(*url_to_fs(s.url)) for s in shards}
    for s in shards:
        if location(fs, url_to_fs(output_url(output, s))[1]) in inputs_at:
            raise ConfigError(f"job.output: {output} would write output shard {s.name} over the input shard "
                              f"{s.url} (job.input); choose an output outside the input")


def check_writable(key: str, url: str, fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Create ``path`` (and its parents), write and remove a marker file there, then remove the
    folders this made: the output ``key`` (at ``url``) can be written.

    Raises:
        ConfigError: ``key``: ``url`` or a folder above it is a regular file, or it cannot be
            created or written (permission, read-only file system, credentials ...).
    """
    made = []
    try:
        probe = path
        while not fs.exists(probe):
            made.append(probe)
            parent = posixpath.dirname(probe.rstrip("/"))
            if not parent or parent == probe:
                break
            probe = parent
        if fs.isfile(probe):
            raise ConfigError(f"{key}: {url} is a regular file, not a folder" if probe == path else
                              f"{key}: {url} cannot be created: {probe} is a regular file")
        fs.makedirs(path, exist_ok=True)
        marker = posixpath.join(path, f".pd-pipeline-preflight-{uuid.uuid4().hex[:8]}")
        with fs.open(marker, "wb") as f:
            f.write(b"")
        fs.rm(marker)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 -- permission, read-only, no credentials ...: one line
        raise ConfigError(f"{key}: cannot create or write {url}: {one_line(exc)}") from None
    finally:
        for folder in made:  # deepest first; a folder someone else filled meanwhile stays
            with contextlib.suppress(Exception):
                fs.rmdir(folder)
