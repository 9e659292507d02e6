"""Work units (pipeline.io.units): how shards are cut into row-group ranges, worked out by hand,
and the assembly of parts into one shard compared with the rows written."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.shards import Shard, iter_batches
from pipeline.io.units import Unit, assemble, cut, part_done, parts_done, plan_units


def test_cut_gathers_row_groups_until_unit_rows():
    # five row groups of 4 rows, units of ~8 rows: groups 0-1 (rows 0-7), 2-3 (8-15), 4 (16-19)
    assert cut(7, [4, 4, 4, 4, 4], 8) == [Unit(7, 0, 3, 0, 8, 0, 2), Unit(7, 1, 3, 8, 8, 2, 2), Unit(7, 2, 3, 16, 4, 4, 1)]
    assert cut(7, [10, 1, 1], 8) == [Unit(7, 0, 2, 0, 10, 0, 1), Unit(7, 1, 2, 10, 2, 1, 2)]
    assert cut(7, [4, 4], 8) == [Unit(7)]  # not more than unit_rows
    assert cut(7, [100], 8) == [Unit(7)]  # one row group is never cut
    assert cut(7, [4, 4, 4], None) == [Unit(7)]
    assert Unit(7, 1, 3, 8, 8, 2, 2).label() == "rows 8-15" and Unit(7).label() == ""


def test_plan_units_reads_only_big_parquet_shards(tmp_path):
    table = pa.table({"id": [f"r{i}" for i in range(20)], "text": [f"t{i}" for i in range(20)]})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=4)
    pq.write_table(table.slice(0, 3), tmp_path / "small.parquet")
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(20)))
    shards = [Shard(0, str(tmp_path / "big.parquet"), "big.parquet"),
              Shard(1, str(tmp_path / "lines.jsonl"), "lines.jsonl"),
              Shard(2, str(tmp_path / "small.parquet"), "small.parquet"),
              Shard(3, str(tmp_path / "gone.parquet"), "gone.parquet")]
    units = plan_units(shards, [20, 20, 3, 20], 8)
    assert units == [*cut(0, [4] * 5, 8), Unit(1), Unit(2), Unit(3)]
    # A unit reads exactly its rows, numbered from the shard's start.
    u = units[1]
    got = [(first, b.column("id").to_pylist()) for first, b in
           iter_batches(shards[0], 1024, row_groups=(u.first_group, u.groups), first_row=u.first_row)]
    assert got == [(8, [f"r{i}" for i in range(8, 16)])]


def test_assemble_writes_the_parts_rows_in_order(tmp_path):
    table = pa.table({"id": [f"r{i}" for i in range(10)], "generation": [f"g{i}" for i in range(10)]})
    parts = [table.slice(0, 4), table.slice(4, 5), table.slice(9, 1)]
    for k, part in enumerate(parts):
        pq.write_table(part, tmp_path / f"part-{k:05d}.parquet", row_group_size=2)
        assert parts_done(tmp_path, 3) is None  # a part not yet marked
        part_done(tmp_path, Unit(0, k, 3), {"rows": part.num_rows})
    assert [t["rows"] for t in parts_done(tmp_path, 3)] == [4, 5, 1]
    assemble(tmp_path, 3, str(tmp_path / "out" / "shard.parquet"))
    assert pq.read_table(tmp_path / "out" / "shard.parquet").to_pylist() == table.to_pylist()
