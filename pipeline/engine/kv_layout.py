"""KV cache sizes from a model's shape.

Formula (per token, all layers, K and V): ``2 x layers x KV heads x head dim x bytes per element``
(the standard count, e.g. vLLM's ``AttentionSpec.page_size_bytes`` divided by block size;
Llama-3.1-70B bf16: 2 x 80 x 8 x 128 x 2 = 327,680 bytes = 320 KiB).
"""

from __future__ import annotations

from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """KV cache bytes one token occupies across all layers (bytes).

    Raises:
        ValueError: ``dtype`` is not a known element type.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def kv_bytes_per_token_from_hf(config: dict, dtype: str) -> int:
    """:func:`kv_bytes_per_token` from a Hugging Face ``config.json`` dict (``num_hidden_layers``,
    ``num_key_value_heads`` defaulting to ``num_attention_heads``, ``head_dim`` defaulting to
    ``hidden_size / num_attention_heads``)."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return kv_bytes_per_token(config["num_hidden_layers"], kv_heads, head_dim, dtype)


def kv_capacity_tokens(engine: Any) -> int | None:
    """Tokens the engine's KV cache holds (KV blocks x block size, as vLLM sized it at start;
    None if vLLM did not report it)."""
    cache = engine.vllm_config.cache_config
    if not cache.num_gpu_blocks or not cache.block_size:
        return None
    return int(cache.num_gpu_blocks) * int(cache.block_size)
