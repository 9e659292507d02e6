"""The output shard's assembly."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.io.output import RowResult, build_output, output_schema, row_ids


def test_build_output_order_passthrough_and_generated_ids():
    src = pa.table({"text": ["a", "b"], "meta": [{"k": 1}, {"k": 2}]})
    ids = row_ids(src, "id", "s.parquet")
    assert ids.to_pylist() == ["s.parquet:0", "s.parquet:1"]
    out = build_output(src, ids, "id", "text", [RowResult(generation="x"), RowResult(error="bad")])
    assert out.column_names[:2] == ["id", "meta"]
    assert out.column("meta").to_pylist() == [{"k": 1}, {"k": 2}]
    assert out.column("generation").to_pylist() == ["x", None]
    assert out.column("error").to_pylist() == [None, "bad"]
    with pytest.raises(ValueError, match="results for 2 input rows"):
        build_output(src, ids, "id", "text", [RowResult()])
    clash = pa.table({"text": ["a"], "error": ["e"]})
    with pytest.raises(ValueError, match="clashes"):
        build_output(clash, row_ids(clash, "id", "s"), "id", "text", [RowResult()])


def test_clashing_input_columns_kept_under_the_prefix_and_schema_matches():
    src = pa.table({"id": ["a"], "text": ["t"], "generation": ["old"], "error": [None]},
                   schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("generation", pa.string()),
                                     ("error", pa.string())]))
    out = build_output(src, row_ids(src, "id", "s"), "id", "text", [RowResult(generation="new")], prefix="input_")
    assert out.column("input_generation").to_pylist() == ["old"]
    assert out.column("generation").to_pylist() == ["new"]
    assert out.schema.equals(output_schema(src.schema, "id", "text", prefix="input_"))
    with pytest.raises(ValueError, match="job.input_column_prefix"):
        output_schema(src.schema, "id", "text")
