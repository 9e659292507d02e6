"""Fast checks of the pieces, each against a hand-computed or independently read value."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import SAMPLE
from pipeline.config import compose
from pipeline.data.output import RowResult, build_output, row_ids
from pipeline.data.prompts import make_prompts
from pipeline.data.shards import list_shards, read_shard, write_atomic
from pipeline.kv.layout import kv_bytes_per_token, kv_bytes_per_token_from_hf
from pipeline.launch.local import cpu_slices
from pipeline.roles.channel import Handoff, decode, encode


def test_kv_bytes_per_token_published_llama_70b():
    # Llama-3.1-70B, bf16: 320 KiB per token (2 x 80 layers x 8 KV heads x 128 x 2 bytes).
    assert kv_bytes_per_token(80, 8, 128, "bfloat16") == 320 * 1024


def test_kv_bytes_per_token_from_hf_config_defaults_head_dim():
    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert kv_bytes_per_token_from_hf(cfg, "bfloat16") == 2 * 30 * 3 * 64 * 2
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv_bytes_per_token_from_hf(cfg, "int3")


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


def test_write_atomic_leaves_only_the_shard(tmp_path):
    t = pa.table({"a": [1, 2, 3]})
    write_atomic(t, (tmp_path / "out" / "s.parquet").as_uri())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["s.parquet"]
    assert pq.read_table(tmp_path / "out" / "s.parquet").equals(t)


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


class _Tok:
    """Whitespace tokenizer standing in for the model's (no chat template): the prompt checks
    only count tokens."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True, split_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


def test_make_prompts_errors_name_the_cause():
    job = compose(["+job=summarize"]).job
    texts = ["fine text", None, "", "   \n", 42, "word " * 100]
    prompts = make_prompts(texts, [str(i) for i in range(6)], job, _Tok(), max_model_len=50)
    assert prompts[0].error is None and prompts[0].token_ids
    assert "null" in prompts[1].error
    assert "empty" in prompts[2].error and "empty" in prompts[3].error
    assert "int" in prompts[4].error
    assert "max_model_len" in prompts[5].error
    assert [p.row for p in prompts] == list(range(6))


def test_make_prompts_bytes_duplicates_and_truncation():
    job = compose(["+job=summarize", "job.too_long=truncate"]).job
    texts = [b"valid bytes", b"\xff\xfe broken", "a " * 100, "dup one", "dup two"]
    prompts = make_prompts(texts, [str(i) for i in range(5)], job, _Tok(), max_model_len=50,
                           ids=["a", "b", "c", "d", "d"])
    assert prompts[0].error is None
    assert "not valid UTF-8" in prompts[1].error and "0xff" in prompts[1].error
    assert prompts[2].truncated and len(prompts[2].token_ids) == 49
    assert prompts[3].error is None
    assert "duplicate id 'd'" in prompts[4].error and "row 3" in prompts[4].error


def test_channel_round_trip_and_rejects_garbage():
    h = Handoff(key="0:1", request_id="row0:1", owner="prefill-0@h", attempt=1.0, prompt_token_ids=[1, 2], max_tokens=4, temperature=0.0, top_p=1.0,
                seed=None, kv_transfer_params={"remote_block_ids": [[1]]}, prefill_done_at=1.5)
    assert decode(encode(h)) == h
    with pytest.raises(msgspec.DecodeError):
        decode(b"\x93\x01\x02\x03")


def test_cpu_slices_partition_cores():
    import os

    n = len(os.sched_getaffinity(0))
    slices = cpu_slices(2, "partition")
    assert len(slices) == 2
    if n >= 2:
        cores = [int(c) for s in slices for c in s.split(",")]
        assert sorted(cores) == sorted(os.sched_getaffinity(0)) and len(set(cores)) == n
    assert cpu_slices(3, "auto") == [None, None, None]
