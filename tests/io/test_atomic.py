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


def test_a_failed_write_leaves_nothing_and_long_names_fit(tmp_path):
    import pytest

    from pipeline.io.atomic import atomic_write, write_json

    with pytest.raises(RuntimeError):
        with atomic_write(tmp_path / "out" / "s.parquet") as f:
            f.write(b"half")
            raise RuntimeError("disk full")
    assert list((tmp_path / "out").iterdir()) == []
    name = "n" * 250 + ".json"  # 255 bytes: a temporary name built on it must be cut
    write_json(tmp_path / name, {"a": 1})
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [name]
