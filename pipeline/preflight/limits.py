"""A model's own limits, read from its ``config.json``: the context it was trained for and the
context one engine's KV cache holds. ``model.max_model_len: null`` resolves to the smaller
(:func:`resolve_max_model_len`), at start, before any check that depends on it."""

from __future__ import annotations

from pipeline.config import Config, ConfigError
from pipeline.engine.kv_layout import DTYPE_BYTES, kv_bytes_per_token_from_hf
from pipeline.preflight.kv_fit import GIB, block_size, hf_config, kv_dtype, on_gpu

#: config.json keys that give a model's context (tokens), in the order transformers' configs use
#: them: Llama, Qwen, Mistral, Gemma ... ``max_position_embeddings``; GPT-2 ``n_positions``;
#: others ``max_sequence_length`` / ``seq_length``.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_context(hf: dict) -> tuple[int, str] | None:
    """``(tokens, key)``: the model's own context from its ``config.json`` (with ``text_config``
    merged, :func:`pipeline.preflight.kv_fit.hf_config`); None when it names none."""
    for key in CONTEXT_KEYS:
        value = hf.get(key)
        if isinstance(value, int) and value > 0:
            return value, key
    return None


def kv_cache_tokens(cfg: Config, hf: dict, role: str) -> int | None:
    """Tokens of one request the KV cache of one ``role`` engine holds, in vLLM's arithmetic
    (:mod:`pipeline.preflight.kv_fit`): ``(N - 1) x block_size`` for ``N`` blocks, ``N`` =
    ``model.kv_cache_gib`` GiB / (``block_size`` x KV bytes per token / TP), or
    ``model.decode_kv_blocks`` for decode. None where the pipeline cannot know it: GPU workers
    (vLLM sizes the cache from the device's free memory), sliding-window or latent attention, a
    KV element type the layout does not know."""
    if hf.get("sliding_window") or hf.get("kv_lora_rank") or any("sliding" in str(t) for t in hf.get("layer_types") or []):
        return None
    block = block_size(cfg, role)
    if role == "decode" and cfg.model.decode_kv_blocks:
        return (cfg.model.decode_kv_blocks - 1) * block
    dtype = kv_dtype(cfg, role)
    if on_gpu(cfg) or dtype not in DTYPE_BYTES:
        return None
    per_block = block * kv_bytes_per_token_from_hf(hf, dtype) / max(cfg.model.tp_of(role), 1)
    return max(int(cfg.model.kv_cache_gib * GIB // per_block) - 1, 0) * block


def roles_of(cfg: Config) -> tuple[str, ...]:
    """The engine roles a run of ``cfg`` starts (``pools=auto``: every one it may choose)."""
    return {"disaggregated": ("prefill", "decode"), "colocated": ("colocated",)}.get(
        cfg.pools.mode, ("prefill", "decode", "colocated"))


def resolve_max_model_len(cfg: Config, model_dir: str | None) -> tuple[int, str]:
    """``(tokens, where from)`` for ``model.max_model_len: null``: the model's own context
    (:func:`model_context`), cut to what the smallest KV cache of the run's engines holds
    (:func:`kv_cache_tokens`; CPU workers only) so that one request of that length always fits.
    A set value is returned as it is.

    Raises:
        ConfigError: the model's folder is not at hand (a bundled model not yet converted) or its
            ``config.json`` names no context; or its KV cache holds fewer than 16 tokens.
    """
    if cfg.model.max_model_len is not None:
        return cfg.model.max_model_len, "set"
    hf = hf_config(model_dir)
    found = model_context(hf) if hf is not None else None
    if found is None:
        where = f"{model_dir}/config.json names no context ({', '.join(CONTEXT_KEYS)})" if hf is not None else \
            "the model's config.json is not at hand yet"
        raise ConfigError(f"model.max_model_len: null takes the model's own context, but {where}: set model.max_model_len")
    context, key = found
    caps = {role: kv_cache_tokens(cfg, hf, role) for role in roles_of(cfg)}
    caps = {role: cap for role, cap in caps.items() if cap is not None}
    if not caps or min(caps.values()) >= context:
        return context, f"config.json {key}"
    role = min(caps, key=caps.get)
    tokens = caps[role]
    setting = "model.decode_kv_blocks" if role == "decode" and cfg.model.decode_kv_blocks else \
        f"model.kv_cache_gib={cfg.model.kv_cache_gib:g}"
    if tokens < 16:
        raise ConfigError(f"model.max_model_len: null: the KV cache of one {role} engine ({setting}) holds {tokens} "
                          f"tokens of this model; raise {setting.split('=')[0]}")
    return tokens, f"config.json {key} {context}, cut to what one {role} engine's KV cache holds ({setting})"
