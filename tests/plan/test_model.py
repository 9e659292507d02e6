"""Model shapes (pipeline/plan/model.py): KV bytes and parameter counts against published figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeline.plan.costs import kv_transfer_time
from pipeline.plan.hardware import hardware
from pipeline.plan.model import MODEL_PRESETS, count_params, load_model


def test_llama_70b_kv_per_token_prompt_and_transfer_match_published_figures():
    m = load_model("llama-3.1-70b")
    # 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 B = 320 KiB (vLLM docs).
    assert m.kv_bytes_per_token == 327_680 == 320 * 1024
    # 8,192 tokens x 320 KiB = 2,560 MiB = 2.5 GiB.
    nbytes = 8192 * m.kv_bytes_per_token
    assert nbytes == pytest.approx(2.5 * 2**30, rel=1e-12)
    # 2.684e9 B / 50e9 B/s = 53.7 ms ("about 54 ms at 50 GB/s").
    assert kv_transfer_time(nbytes, hardware("h100")) == pytest.approx(0.054, abs=0.001)
    # tp devices send their shards over their own links: 4 x 50 GB/s.
    assert kv_transfer_time(nbytes, hardware("h100"), tp=4) == pytest.approx(0.0537 / 4, rel=0.01)


def test_parameter_counts_from_config_match_published_sizes():
    # Llama-3.1-70B: 80 x (8192 x (64 + 16) x 128 + 64 x 128 x 8192 + 3 x 8192 x 28672)
    #   + 2 x 128256 x 8192 = 80 x 855,638,016 + 2,101,346,304 = 70.55e9 (published 70.6B).
    cfg70 = {k: v for k, v in MODEL_PRESETS["llama-3.1-70b"].items() if k != "params"}
    assert count_params(cfg70) == 80 * 855_638_016 + 2_101_346_304
    assert count_params(cfg70) == pytest.approx(70.6e9, rel=0.002)
    cfg8 = {k: v for k, v in MODEL_PRESETS["llama-3.1-8b"].items() if k != "params"}
    assert count_params(cfg8) == pytest.approx(8.03e9, rel=0.002)


def test_model_from_a_config_json_directory(tmp_path):
    # SmolLM2-135M's config.json (the shipped model's shape).
    cfg = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path))
    # KV: 2 x 30 x 3 x 64 x 2 = 23,040 B/token.
    assert m.kv_bytes_per_token == 23_040
    # 30 x (576 x 15 x 64 + 576 x 576 + 3 x 576 x 1536) + 49152 x 576 (tied)
    #   = 30 x 3,538,944 + 28,311,552 = 134,479,872 (published: 135M).
    assert m.params == 134_479_872
    assert m.flop_params == 134_479_872 - 28_311_552
    with pytest.raises(ValueError, match="unknown model"):
        load_model(str(tmp_path / "missing"))


def test_fp8_kv_cache_halves_llama_70b_kv_and_its_transfer():
    bf16 = load_model("llama-3.1-70b")
    fp8 = replace(bf16, kv_cache_dtype="fp8")
    # 2 x 80 x 8 x 128 x 1 byte = 163,840 B = 160 KiB: half of the published 320 KiB (bf16).
    assert fp8.kv_bytes_per_token == 163_840 == 160 * 1024 == bf16.kv_bytes_per_token // 2
    assert fp8.weight_bytes == bf16.weight_bytes  # the weights stay bf16
    # 8,192 tokens: 1.25 GiB, 26.8 ms at 50 GB/s (bf16: 53.7 ms).
    h100 = hardware("h100")
    assert kv_transfer_time(8192 * fp8.kv_bytes_per_token, h100) == pytest.approx(1.25 * 2**30 / 50e9)
    assert kv_transfer_time(8192 * fp8.kv_bytes_per_token, h100) == pytest.approx(
        kv_transfer_time(8192 * bf16.kv_bytes_per_token, h100) / 2)
    for name in ("fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        assert replace(bf16, kv_cache_dtype=name).kv_bytes_per_token == 163_840
    assert replace(bf16, kv_cache_dtype="auto").kv_bytes_per_token == 327_680
    # A float32 model with kv auto: 4 bytes; asking for bfloat16 KV: 2.
    assert replace(bf16, dtype="float32").kv_bytes_per_token == 655_360
    assert replace(bf16, dtype="float32", kv_cache_dtype="bfloat16").kv_bytes_per_token == 327_680
    with pytest.raises(ValueError, match="KV cache dtype 'nvfp4'"):
        replace(bf16, kv_cache_dtype="nvfp4")
