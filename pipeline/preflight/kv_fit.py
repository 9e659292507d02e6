"""One request of ``model.max_model_len`` tokens must fit in every KV store it passes through,
checked at start instead of by vLLM after ~50 s of engine start-up (its "To serve at least one
request with the model's max seq len ... KV cache is needed, which is larger than the available
KV cache memory") or by the router at the first long row.

The arithmetic is vLLM's (0.32, ``vllm.v1.core.kv_cache_utils``): a request of ``L`` tokens
takes ``ceil(L / block_size)`` blocks of ``block_size`` tokens, each token
:func:`pipeline.engine.kv_layout.kv_bytes_per_token` bytes (2 x layers x KV heads x head dim x
element size), split over the ``TP`` ranks of an engine by KV heads; vLLM's block pool keeps one
block back (its null block), so ``N`` blocks hold ``(N - 1) x block_size`` tokens of requests.
The KV cache of a CPU engine is ``model.kv_cache_gib`` GiB per rank (``VLLM_CPU_KVCACHE_SPACE``);
on GPU workers (``cluster.gpus_per_task`` > 0) vLLM sizes it from the device's free memory,
unknown here, so only the block-count and DRAM-tier checks apply.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import Config, ConfigError
from pipeline.engine.kv_layout import DTYPE_BYTES, kv_bytes_per_token_from_hf

GIB = 2**30
# vLLM's default tokens per KV block: 128 on its CPU backend, 16 on CUDA (CacheConfig, 0.32).
DEFAULT_BLOCK_CPU, DEFAULT_BLOCK_GPU = 128, 16


def kv_dtype(cfg: Config, role: str) -> str:
    """The KV cache element type of ``role``'s engines: its ``kv_cache_dtype`` engine argument
    (the pool's own dict over the shared one), else ``model.dtype``."""
    kwargs = dict(cfg.model.engine_kwargs or {})
    if role in ("prefill", "decode"):
        kwargs.update(getattr(cfg.model, f"{role}_engine_kwargs") or {})
    value = kwargs.get("kv_cache_dtype")
    if not value or value == "auto":
        return cfg.model.dtype
    return "fp8" if str(value).startswith("fp8") else str(value)


def on_gpu(cfg: Config) -> bool:
    """Whether the workers run on GPUs (``cluster.gpus_per_task`` > 0)."""
    return (cfg.cluster.gpus_per_task or 0) > 0


def block_size(cfg: Config, role: str) -> int:
    """Tokens per KV block of ``role``'s engines: its setting
    (:meth:`~pipeline.config.schema.ModelConfig.block_size_of`), else vLLM's default on this
    platform (:func:`on_gpu`)."""
    return cfg.model.block_size_of(role) or (DEFAULT_BLOCK_GPU if on_gpu(cfg) else DEFAULT_BLOCK_CPU)


def hf_config(model_dir: str | None) -> dict | None:
    """The model's ``config.json`` with its ``text_config`` merged in; None without a local
    directory holding one."""
    if model_dir is None or not (Path(model_dir) / "config.json").is_file():
        return None
    hf = json.loads((Path(model_dir) / "config.json").read_text())
    hf.update(hf.get("text_config") or {})
    return hf


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.3g} GiB"


def check_kv_fits(cfg: Config, model_dir: str | None) -> None:
    """Refuse a config whose KV stores cannot hold one request of ``model.max_model_len`` tokens:
    the KV cache of each engine (CPU workers), ``model.decode_kv_blocks``, and the DRAM tier
    (``offload.dram_gib``). ``model_dir``: the model's local directory (its ``config.json``
    gives the KV layout); None skips the check (the model is fetched or converted later, and
    vLLM checks at start).

    Raises:
        ConfigError: one line naming the settings involved and the size one request needs.
    """
    hf = hf_config(model_dir)
    if hf is None:
        return
    if hf.get("sliding_window") or hf.get("kv_lora_rank") or any("sliding" in str(t) for t in hf.get("layer_types") or []):
        return  # sliding-window or latent (MLA) attention: not this layout; vLLM checks at start
    m = cfg.model
    tokens = m.max_model_len
    gpu = on_gpu(cfg)
    roles = {"disaggregated": ("prefill", "decode"), "colocated": ("colocated",)}.get(
        cfg.pools.mode, ("prefill", "decode", "colocated"))
    for role in roles:
        block = block_size(cfg, role)
        blocks = -(-tokens // block)
        dtype = kv_dtype(cfg, role)
        if dtype not in DTYPE_BYTES:
            continue  # a KV dtype the layout does not know: vLLM checks it at start
        per_token = kv_bytes_per_token_from_hf(hf, dtype)
        tp = m.tp_of(role)
        need = blocks * block * per_token / max(tp, 1)
        if not gpu and need > m.kv_cache_gib * GIB:
            raise ConfigError(
                f"model.kv_cache_gib={m.kv_cache_gib:g} is too small for one request of model.max_model_len="
                f"{tokens} tokens: its KV cache needs {_gib(need)} per {role} engine"
                f"{f' rank (TP {tp})' if tp > 1 else ''} ({blocks} blocks of {block} tokens x "
                f"{per_token} bytes per token in {dtype}, model.dtype={m.dtype}); raise model.kv_cache_gib "
                f"or lower model.max_model_len")
    block = block_size(cfg, "decode")
    blocks = -(-tokens // block)
    if m.decode_kv_blocks and "decode" in roles and (m.decode_kv_blocks - 1) * block < tokens:
        raise ConfigError(
            f"model.decode_kv_blocks={m.decode_kv_blocks} holds {(m.decode_kv_blocks - 1) * block} tokens "
            f"(vLLM keeps one block of {block} tokens back), less than one request of model.max_model_len="
            f"{tokens}: set at least {blocks + 1} blocks or lower model.max_model_len")
    if "decode" in roles and cfg.offload.dram(tokens) and m.dtype in DTYPE_BYTES:
        slot = block * kv_bytes_per_token_from_hf(hf, m.dtype)
        slots = int(cfg.offload.dram_gib * GIB) // slot
        if slots < blocks:
            raise ConfigError(
                f"offload.dram_gib={cfg.offload.dram_gib:g} holds {slots} KV blocks of {block} tokens "
                f"({slot} bytes each in model.dtype={m.dtype}), fewer than the {blocks} one request of "
                f"model.max_model_len={tokens} tokens needs ({_gib(blocks * slot)}); raise offload.dram_gib")
