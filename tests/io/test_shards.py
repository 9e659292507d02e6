"""Input shard discovery and reading."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline.io.shards import list_shards, read_shard
from tests.conftest import SAMPLE


def test_list_shards_directory_glob_file_and_file_url():
    names = ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    assert [s.name for s in list_shards(str(SAMPLE))] == names
    assert [s.name for s in list_shards(SAMPLE.as_uri())] == names
    assert [s.name for s in list_shards(str(SAMPLE / "shard-0000[12].parquet"))] == names[1:]
    one = list_shards(str(SAMPLE / names[0]))
    assert [(s.index, s.name) for s in one] == [(0, names[0])]
    assert read_shard(one[0]).num_rows == pq.read_metadata(SAMPLE / names[0]).num_rows


def test_list_shards_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        list_shards(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="no .parquet shards"):
        list_shards(str(tmp_path))
