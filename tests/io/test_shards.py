"""Input shard discovery and reading."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline.io.shards import list_shards, read_shard
from tests.helpers import SAMPLE


def test_list_shards_directory_glob_file_and_file_url():
    names = ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [s.name for s in list_shards(str(SAMPLE))] == names
    assert [s.name for s in list_shards(SAMPLE.as_uri())] == names
    assert [s.name for s in list_shards(str(SAMPLE / "part-0000[12].parquet"))] == names[1:]
    one = list_shards(str(SAMPLE / names[0]))
    assert [(s.index, s.name) for s in one] == [(0, names[0])]
    assert read_shard(one[0]).num_rows == pq.read_metadata(SAMPLE / names[0]).num_rows


def test_list_shards_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        list_shards(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="no .parquet shards"):
        list_shards(str(tmp_path))


def test_shards_named_by_their_path_below_the_input_root(tmp_path):
    import pyarrow as pa

    for name in ("lang=en/part-0.parquet", "lang=fr/part-0.parquet", "top.parquet", "lang=en/.tmp.parquet",
                 "_SUCCESS.parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": ["x"]}), tmp_path / name)
    (tmp_path / "README.md").write_text("not a shard")
    want = ["lang=en/part-0.parquet", "lang=fr/part-0.parquet", "top.parquet"]
    assert [s.name for s in list_shards(str(tmp_path))] == want
    assert [s.name for s in list_shards(str(tmp_path / "*" / "part-*.parquet"))] == want[:2]
    assert [s.name for s in list_shards(str(tmp_path / "lang=fr" / "part-0.parquet"))] == ["part-0.parquet"]


def test_run_dir_names_stay_under_the_name_limit_and_apart(tmp_path):
    from pipeline.io.shards import shard_path

    assert shard_path(tmp_path, "a=1/b c.parquet", ".json") == tmp_path / "a=1" / "b c.parquet.json"
    long1, long2 = "x" * 250 + "1.parquet", "x" * 250 + "2.parquet"
    p1, p2 = shard_path(tmp_path, long1, ".json"), shard_path(tmp_path, long2, ".json")
    assert p1 != p2 and len(p1.name.encode()) <= 255 and p1.name.endswith(".json")
    p1.write_text("{}")  # the file system takes it


def test_duplicate_ids_across_read_batches(tmp_path):
    import pyarrow as pa

    from pipeline.io.shards import duplicate_id_rows

    pq.write_table(pa.table({"id": ["a", "b", "c", "a", None, None, "b"], "text": ["t"] * 7}), tmp_path / "s.parquet")
    shard = list_shards(str(tmp_path))[0]
    # Two rows a read: every duplicate is in another batch than its first occurrence.
    assert duplicate_id_rows(shard, "id", rows=2) == {
        3: "duplicate id 'a' (first at row 0)", 5: "duplicate id None (first at row 4)",
        6: "duplicate id 'b' (first at row 1)"}
    assert duplicate_id_rows(shard, "absent") == {}


def test_run_files_lists_files_only_never_a_shards_folder_or_a_temporary_file(tmp_path):
    """Issue #30: under a run directory, folders are named after the user's shards, which may be
    named like the run's own files; only files are the run's, and hidden ones are temporary."""
    from pipeline.io.atomic import temporary_name
    from pipeline.io.shards import run_files

    base = tmp_path / "metrics" / "requests"
    own = [base / "part-0.parquet" / "part-a.parquet", base / "lang=en" / "part-1.parquet" / "part-b.parquet",
           base / "data.parquet" / "part-00000.parquet" / "part-c.parquet"]
    for p in own:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    (base / "part-0.parquet" / temporary_name("part-d.parquet")).write_bytes(b"partial")
    assert run_files(base, "part-*.parquet", recursive=True) == sorted(own)
    assert run_files(base / "part-0.parquet", "part-*.parquet") == [own[0]]
    assert run_files(base, "part-*.parquet") == []  # the shards' folders at the top are not files
