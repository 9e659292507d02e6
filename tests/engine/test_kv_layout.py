"""KV bytes per token against published figures."""

from __future__ import annotations

import pytest

from pipeline.engine.kv_layout import kv_bytes_per_token, kv_bytes_per_token_from_hf


def test_kv_bytes_per_token_published_llama_70b():
    # Llama-3.1-70B, bf16: 320 KiB per token (2 x 80 layers x 8 KV heads x 128 x 2 bytes).
    assert kv_bytes_per_token(80, 8, 128, "bfloat16") == 320 * 1024


def test_kv_bytes_per_token_from_hf_config_defaults_head_dim():
    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert kv_bytes_per_token_from_hf(cfg, "bfloat16") == 2 * 30 * 3 * 64 * 2
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv_bytes_per_token_from_hf(cfg, "int3")
