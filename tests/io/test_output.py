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


def test_samples_as_lists_with_their_schema_and_a_row_asking_for_more_samples_than_the_run():
    from types import SimpleNamespace

    from pipeline.config import SamplingConfig
    from pipeline.io.output import SAMPLE_COLUMNS, served_row
    from pipeline.io.sampling import row_sampling

    other = SimpleNamespace(text="b", token_ids=[7, 8, 9], finish_reason="length", stop_reason=None,
                            cumulative_logprob=None, logprobs=None)
    times = dict(token_times=[1.0, 2.0], prefill_start=0.5, prefill_end=None, prefill_worker="w")
    one = served_row(text="a", token_ids=[5, 6], finish_reason="stop", error=None, **times)
    two = served_row(text="a", token_ids=[5, 6], finish_reason="stop", error=None, others=[other], samples=True, **times)
    bad = served_row(text="", token_ids=[], finish_reason=None, error="why", samples=True, **times)
    assert one.generation == "a" and one.output_tokens == 2
    assert two.generation == ["a", "b"] and two.generation_token_ids == [[5, 6], [7, 8, 9]]
    assert two.finish_reason == ["stop", "length"] and two.output_tokens == 5 and two.ttft_s == 0.5
    assert all(getattr(bad, c) is None for c in SAMPLE_COLUMNS) and bad.error == "why"
    src = pa.table({"id": ["x", "y"], "text": ["p", "q"]})
    out = build_output(src, src.column("id"), "id", "text", [two, bad], samples=True)
    assert out.schema.equals(output_schema(src.schema, "id", "text", samples=True))
    assert out.schema.field("generation_token_ids").type == pa.list_(pa.list_(pa.int32()))
    assert out.column("generation").to_pylist() == [["a", "b"], None]
    # A row may ask for fewer samples than the run, never for samples in a run of one.
    assert row_sampling(SamplingConfig(n=3), {"n": 1}, "sp").n == 1
    with pytest.raises(ValueError, match=r"sp\.n: 2 samples need job\.sampling\.n > 1"):
        row_sampling(SamplingConfig(), {"n": 2}, "sp")
    with pytest.raises(ValueError, match=r"sp\.n: must be >= 1"):
        row_sampling(SamplingConfig(n=3), {"n": 0}, "sp")
