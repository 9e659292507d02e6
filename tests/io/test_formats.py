"""JSON Lines and CSV shards: discovery beside Parquet, schemas from the head, bounded batches,
bad lines kept as rows that say why, output names, and what the preflight reads of them."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import ConfigError, compose
from pipeline.io import formats
from pipeline.io.shards import (duplicate_id_rows, iter_batches, list_shards, output_url, read_shard, shard_format,
                                shard_rows, shard_schema)
from pipeline.preflight import preflight
from pipeline.preflight.inputs import check_columns, read_footers


def _jsonl(path, lines: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
                              for line in lines))


def _rows(shard, rows: int = 1024) -> list[dict]:
    return [r for _, b in iter_batches(shard, rows) for r in b.to_pylist()]


def test_discovery_finds_every_format_each_file_by_its_extension(tmp_path):
    pq.write_table(pa.table({"text": ["p"]}), tmp_path / "a.parquet")
    _jsonl(tmp_path / "b" / "c.jsonl", [{"text": "j"}])
    _jsonl(tmp_path / "d.JSON", [{"text": "J"}])
    _jsonl(tmp_path / "e.ndjson", [{"text": "n"}])
    (tmp_path / "f.csv").write_text("text\nc\n")
    (tmp_path / "README.md").write_text("not a shard")
    _jsonl(tmp_path / "_skipped.jsonl", [{"text": "hidden"}])
    shards = list_shards(str(tmp_path))
    assert [(s.name, shard_format(s)) for s in shards] == [
        ("a.parquet", "parquet"), ("b/c.jsonl", "jsonl"), ("d.JSON", "jsonl"), ("e.ndjson", "jsonl"), ("f.csv", "csv")]
    assert [output_url("/out", s) for s in shards] == [
        "/out/a.parquet", "/out/b/c.parquet", "/out/d.parquet", "/out/e.parquet", "/out/f.parquet"]
    assert [_rows(s)[0]["text"] for s in shards] == ["p", "j", "J", "n", "c"]
    assert [s.name for s in list_shards(str(tmp_path / "*.csv"))] == ["f.csv"]
    assert [s.name for s in list_shards(str(tmp_path / "b" / "c.jsonl"))] == ["c.jsonl"]


def test_jsonl_typed_from_its_head_bad_lines_kept_as_rows_in_bounded_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "HEAD_ROWS", 4)
    path = tmp_path / "docs.jsonl"
    _jsonl(path, [
        {"id": 1, "text": "one", "meta": {"k": 1}, "tags": None, "mixed": 1},
        b"{not json",
        b"   ",  # blank: not a row
        [1, 2],
        {"id": 2, "text": "two", "meta": {"k": 2}, "tags": None, "mixed": "x"},
        {"id": "three", "text": "three", "tags": ["a"], "late": True},  # id no integer; "late" after the head
        b'{"id": 4, "text": "\xff\xfe"}',
        {"id": 5, "text": 5, "mixed": [1]},
    ])
    shard = list_shards(str(path))[0]
    schema = shard_schema(shard)
    assert [(f.name, str(f.type)) for f in schema] == [
        ("id", "int64"), ("text", "string"), ("meta", "struct<k: int64>"), ("tags", "string"),
        ("mixed", "string"), ("line_error", "string")]
    assert shard_rows(shard) == 7
    batches = list(iter_batches(shard, 3))
    assert [(first, b.num_rows) for first, b in batches] == [(0, 3), (3, 3), (6, 1)]
    rows = [r for _, b in batches for r in b.to_pylist()]
    assert rows[0] == {"id": 1, "text": "one", "meta": {"k": 1}, "tags": None, "mixed": "1", "line_error": None}
    assert rows[1]["line_error"].startswith("line 2 is not valid JSON") and rows[1]["text"] is None
    assert rows[2]["line_error"] == "line 4 is a JSON array, not an object"
    assert rows[3]["mixed"] == "x" and rows[3]["line_error"] is None
    assert rows[4]["line_error"] == "line 6: id is a JSON string, not int64" and rows[4]["text"] == "three"
    assert rows[4]["tags"] == '["a"]' and "late" not in rows[4]
    assert rows[5]["line_error"] == "line 7 is not valid UTF-8 (byte 0xff at offset 19)"
    # A value that does not fit its column is the row's error; loose columns keep others as JSON text.
    assert rows[6]["line_error"] == "line 8: text is a JSON number, not string" and rows[6]["mixed"] == "[1]"
    assert all(b.schema.equals(schema) for _, b in batches)
    assert [b.num_rows for _, b in iter_batches(shard, 2, ["id"])] == [2, 2, 2, 1]
    assert read_shard(shard).num_rows == 7


def test_csv_typed_from_its_head_with_quoted_newlines_bad_rows_and_late_misfits(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "HEAD_ROWS", 3)
    path = tmp_path / "t.csv"
    path.write_bytes(b'id,text,score\n1,hello,0.5\n2,"multi\nline",\n3,x,y,z\n'
                     b'4,"say ""hi""",1e3\nfive,ok,2\n6,\xff bad,3\n\n7,last,NA\n')
    shard = list_shards(str(path))[0]
    schema = shard_schema(shard)
    assert [(f.name, str(f.type)) for f in schema] == [
        ("id", "int64"), ("text", "string"), ("score", "double"), ("line_error", "string")]
    assert shard_rows(shard) == 7
    rows = _rows(shard, 2)
    assert rows[0] == {"id": 1, "text": "hello", "score": 0.5, "line_error": None}
    assert rows[1] == {"id": 2, "text": "multi\nline", "score": None, "line_error": None}
    assert rows[2] == {"id": None, "text": None, "score": None, "line_error": "line 5 has 4 fields; the header has 3"}
    assert rows[3] == {"id": 4, "text": 'say "hi"', "score": 1000.0, "line_error": None}
    assert rows[4]["id"] is None and rows[4]["line_error"].startswith("line 7: ")  # "five" is no int64
    assert rows[5]["line_error"] == "line 8 is not valid UTF-8 (byte 0xff at offset 0 of its field)"
    assert rows[6] == {"id": 7, "text": "last", "score": None, "line_error": None}
    header_only = tmp_path / "empty.csv"
    header_only.write_text("id,text\n")
    empty = list_shards(str(header_only))[0]
    assert shard_schema(empty).names == ["id", "text", "line_error"] and _rows(empty) == []


def test_duplicate_ids_and_preflight_schema_and_rows_without_a_footer(tmp_path):
    _jsonl(tmp_path / "in" / "a.jsonl", [{"id": "x", "text": "a"}, b"oops", {"id": "x", "text": "b"}])
    (tmp_path / "in" / "b.csv").write_text("id,text\n1,a\n2,b\n")
    shards = list_shards(str(tmp_path / "in"))
    assert duplicate_id_rows(shards[0], "id", rows=1) == {2: "duplicate id 'x' (first at row 0)"}
    schemas, rows, unreadable = read_footers(shards)
    assert rows == [3, 2] and unreadable == {}
    cfg = compose(["+job=summarize", f"job.input={tmp_path / 'in'}"])
    assert check_columns(cfg, schemas, [s.name for s in shards]) == {}
    cfg = compose(["+job=summarize", f"job.input={tmp_path / 'in'}", "job.text_column=body"])
    with pytest.raises(ConfigError, match="job.text_column: column 'body' is not in shard a.jsonl"):
        check_columns(cfg, schemas, [s.name for s in shards])


def test_two_shards_writing_one_output_are_refused_at_start(tmp_path):
    src = tmp_path / "in"
    _jsonl(src / "a" / "b.jsonl", [{"text": "j"}])
    pq.write_table(pa.table({"text": ["p"]}), src / "a" / "b.parquet")
    cfg = compose(["+job=summarize", f"job.input={src}", f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as refused:
        preflight(cfg)
    line = str(refused.value)
    assert "\n" not in line and line == ("job.input: shards a/b.jsonl and a/b.parquet would both write the output "
                                         "shard a/b.parquet; rename or move one")
    (src / "a" / "b.parquet").rename(src / "a" / "c.parquet")
    assert preflight(cfg).rows == [1, 1]


def test_csv_byte_order_mark_empty_files_and_a_json_array_file(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "bom.csv").write_bytes(b"\xef\xbb\xbfid,text\r\n1,hello world\r\n2,second doc\r\n")  # Excel's export
    (inp / "empty.csv").write_bytes(b"")
    (inp / "nothing.jsonl").write_bytes(b"")
    (inp / "array.json").write_text(json.dumps([{"id": 1, "text": "a"}, {"id": 2, "text": "b"}]))
    shards = {s.name: s for s in list_shards(str(inp))}
    assert shard_schema(shards["bom.csv"]).names == ["id", "text", formats.LINE_ERROR]
    assert [r["id"] for r in _rows(shards["bom.csv"])] == [1, 2]
    assert _rows(shards["empty.csv"]) == [] and _rows(shards["nothing.jsonl"]) == []
    # One JSON document, not JSON Lines: one row that says so (the run serves it as an error row).
    assert [r[formats.LINE_ERROR] for r in _rows(shards["array.json"])] == ["line 1 is a JSON array, not an object"]
    # None of these is refused at start: the others' columns are checked, theirs become rows.
    schemas, rows, _ = read_footers(list(shards.values()))
    cfg = compose(["+job=summarize", f"job.input={inp}"])
    assert check_columns(cfg, schemas, list(shards)) == {}


def test_csv_record_with_bytes_that_are_not_utf8_keeps_its_id(tmp_path):
    (tmp_path / "bad.csv").write_bytes(b"id,text,n\n1,caf\xe9 ok,5\n2,fine,6\n")
    (shard,) = list_shards(str(tmp_path))
    rows = _rows(shard)
    assert [r["id"] for r in rows] == [1, 2] and [r["n"] for r in rows] == [5, 6]
    assert rows[0][formats.LINE_ERROR] == "line 2 is not valid UTF-8 (byte 0xe9 at offset 3 of its field)"
    assert rows[1][formats.LINE_ERROR] is None and rows[1]["text"] == "fine"
