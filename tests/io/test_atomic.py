"""The one atomic-write helper."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.atomic import write_parquet


def test_write_atomic_leaves_only_the_shard(tmp_path):
    t = pa.table({"a": [1, 2, 3]})
    write_parquet(t, (tmp_path / "out" / "s.parquet").as_uri())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["s.parquet"]
    assert pq.read_table(tmp_path / "out" / "s.parquet").equals(t)
