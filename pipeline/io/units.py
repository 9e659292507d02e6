"""Work units: what one worker claims at a time (:mod:`pipeline.runtime.claims`).

A unit is a whole shard, or, for a Parquet shard of more than ``job.unit_rows`` rows, a range of
its row groups holding about ``job.unit_rows`` rows, so that one big shard does not keep one
worker busy while the others sit finished. A unit never cuts a row group (a unit's worker reads
only its own row groups), so a shard of a single row group is one unit whatever its size; JSON
Lines and CSV shards have no row groups and are one unit each.

Each part of a split shard is written to ``RUN_DIR/parts/<shard>/part-K.parquet`` and marked in
``RUN_DIR/parts/<shard>/part-K.json``; whoever finishes a shard's last part assembles the output
shard from the parts, in row order (:func:`assemble`), and marks the shard done, so a split shard
gives exactly the output file an unsplit one gives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow.parquet as pq

from pipeline.io.atomic import atomic_write, url_to_fs, write_json
from pipeline.io.formats import file_format


@dataclass(frozen=True)
class Unit:
    """Part ``part`` of ``parts`` of shard ``shard`` (its index): rows ``[first_row, first_row +
    rows)``, which are its row groups ``[first_group, first_group + groups)``. A whole shard is
    ``parts == 1`` with ``rows`` and ``groups`` None (read it all)."""

    shard: int
    part: int = 0
    parts: int = 1
    first_row: int = 0
    rows: int | None = None
    first_group: int = 0
    groups: int | None = None

    @property
    def split(self) -> bool:
        return self.parts > 1

    def label(self) -> str:
        """``rows 0-99`` for a part, empty for a whole shard."""
        return f"rows {self.first_row}-{self.first_row + self.rows - 1}" if self.split and self.rows else ""


def cut(shard: int, group_rows: list[int], unit_rows: int | None) -> list[Unit]:
    """Shard ``shard``'s units from its row groups' sizes (rows each): consecutive row groups
    gathered until they hold at least ``unit_rows`` rows; one unit when that gives one (or
    ``unit_rows`` is None)."""
    if unit_rows is None or sum(group_rows) <= unit_rows or len(group_rows) < 2:
        return [Unit(shard)]
    spans: list[tuple[int, int, int, int]] = []  # first group, groups, first row, rows
    g0 = r0 = rows = 0
    for g, n in enumerate(group_rows):
        rows += n
        if rows >= unit_rows or g == len(group_rows) - 1:
            spans.append((g0, g + 1 - g0, r0, rows))
            g0, r0, rows = g + 1, r0 + rows, 0
    if len(spans) == 1:
        return [Unit(shard)]
    return [Unit(shard, k, len(spans), r, n, g, ng) for k, (g, ng, r, n) in enumerate(spans)]


def plan_units(shards: Iterable[Any], rows: Iterable[int | None], unit_rows: int | None) -> list[Unit]:
    """The run's units, shard by shard in order. Only Parquet shards of more than ``unit_rows``
    rows (``rows``: each shard's count from its footer, None when unreadable) are read again,
    for their row groups; a footer that cannot be read leaves the shard whole (it fails as a
    whole when read)."""
    out: list[Unit] = []
    for shard, n in zip(shards, rows):
        if unit_rows is None or n is None or n <= unit_rows or file_format(shard.name) != "parquet":
            out.append(Unit(shard.index))
            continue
        fs, path = url_to_fs(shard.url)
        try:
            with fs.open(path, "rb") as f:
                meta = pq.ParquetFile(f).metadata
                groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        except Exception:  # noqa: BLE001 -- read again when served, where it fails with its reason
            groups = []
        out += cut(shard.index, groups, unit_rows)
    return out


def part_file(folder: Path, part: int, suffix: str) -> Path:
    """Part ``part``'s file in a split shard's ``folder``: its rows (``.parquet``) or its mark
    (``.json``)."""
    return folder / f"part-{part:05d}{suffix}"


def part_written(folder: Path, unit: Unit) -> bool:
    """Whether ``unit``'s part is written and marked (:func:`part_done`)."""
    return part_file(folder, unit.part, ".json").exists()


def part_done(folder: Path, unit: Unit, totals: dict[str, Any]) -> None:
    """Mark part ``unit.part`` written, with its totals (after its Parquet part is in place)."""
    write_json(part_file(folder, unit.part, ".json"), totals)


def parts_done(folder: Path, parts: int) -> list[dict[str, Any]] | None:
    """The totals of every part of a shard split in ``parts``, in order; None while one is
    missing."""
    out = []
    for k in range(parts):
        try:
            out.append(json.loads(part_file(folder, k, ".json").read_text()))
        except (OSError, ValueError):
            return None
    return out


def assemble(folder: Path, parts: int, url: str) -> None:
    """Write the output shard ``url`` from the parts in ``folder``, in order, one row group at a
    time (memory holds one row group), atomically: readers see the whole shard or nothing.

    Raises:
        OSError: a part cannot be read or the output written.
    """
    with atomic_write(url) as f:
        writer = None
        try:
            for k in range(parts):
                part = pq.ParquetFile(part_file(folder, k, ".parquet"))
                writer = writer or pq.ParquetWriter(f, part.schema_arrow)
                for g in range(part.num_row_groups):
                    writer.write_table(part.read_row_group(g))
        finally:
            if writer is not None:
                writer.close()
