"""The engine settings a run resolves for each pool, and where each came from, for ``--dry-run``:
``user`` (an override), ``preset`` (the chosen options' configs, e.g. the bundled model's
``conf/model/smollm2-135m.yaml``), ``model`` (the model's own ``config.json``), or ``default``
(the schema's, or vLLM's on this kind of worker)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import Config
from pipeline.engine.build import GPU_MEMORY_UTILIZATION
from pipeline.preflight.limits import kv_cache_tokens, roles_of
from pipeline.preflight.kv_fit import DEFAULT_BLOCK_CPU, DEFAULT_BLOCK_GPU, hf_config, on_gpu


@dataclass(frozen=True)
class Setting:
    """One resolved setting: ``name`` as the page prints it, its ``value`` in words, ``origin``
    (user, preset, model, default) and the key that sets it."""

    name: str
    value: str
    origin: str
    key: str


def _origin(cfg: Config, key: str) -> str:
    origins = getattr(cfg, "origins", None)
    return origins.of(key) if origins is not None else "config"


def engine_settings(cfg: Config, model_dir: str | None, context_from: str) -> dict[str, list[Setting]]:
    """``role -> [Setting]`` for each engine role the run starts (``pools=auto``: each it may
    choose): TP, ``max_model_len`` (tokens), dtype, KV memory (CPU workers: GiB per rank and the
    blocks it makes; GPU workers: the share of the device's memory), block size (tokens), eager
    or CUDA graphs. ``context_from``: where :func:`pipeline.preflight.limits.resolve_max_model_len`
    took ``max_model_len`` from (``set`` when the config gives it)."""
    m = cfg.model
    gpu = on_gpu(cfg)
    hf = hf_config(model_dir)
    out: dict[str, list[Setting]] = {}
    for role in roles_of(cfg):
        tp_key = "model.decode_tp" if role == "decode" else "model.prefill_tp"
        own_block = {"prefill": m.prefill_block_size, "decode": m.decode_block_size}.get(role)
        block_key = f"model.{role}_block_size" if own_block else "model.block_size" if m.block_size else None
        block = m.block_size_of(role) or (DEFAULT_BLOCK_GPU if gpu else DEFAULT_BLOCK_CPU)
        rows = [
            Setting("TP", str(m.tp_of(role)), _origin(cfg, tp_key), tp_key),
            Setting("max_model_len", f"{m.max_model_len} tokens",
                    _origin(cfg, "model.max_model_len") if context_from == "set" else f"model: {context_from}",
                    "model.max_model_len"),
            Setting("dtype", m.dtype, _origin(cfg, "model.dtype"), "model.dtype"),
        ]
        if role == "decode" and m.decode_kv_blocks:
            rows.append(Setting("KV cache", f"{m.decode_kv_blocks} blocks", _origin(cfg, "model.decode_kv_blocks"),
                                "model.decode_kv_blocks"))
        elif gpu:
            share = m.gpu_memory_utilization if m.gpu_memory_utilization is not None else GPU_MEMORY_UTILIZATION
            origin = _origin(cfg, "model.gpu_memory_utilization")
            rows.append(Setting("KV cache", f"what {share:g} of each GPU's memory leaves after the weights (vLLM sizes it)",
                                origin if m.gpu_memory_utilization is not None else "default on GPU workers",
                                "model.gpu_memory_utilization"))
        else:
            held = kv_cache_tokens(cfg, hf, role) if hf is not None else None
            blocks = f": {held // block + 1} blocks, {held:,} tokens" if held is not None else ""
            rows.append(Setting("KV cache", f"{m.kv_cache_gib:g} GiB a rank{blocks}", _origin(cfg, "model.kv_cache_gib"),
                                "model.kv_cache_gib"))
        rows.append(Setting("block size", f"{block} tokens", _origin(cfg, block_key) if block_key else
                            f"vLLM's default on {'GPU' if gpu else 'CPU'}", block_key or "model.block_size"))
        eager = m.enforce_eager if m.enforce_eager is not None else not gpu
        rows.append(Setting("eager", "yes" if eager else "no (CUDA graphs)",
                            _origin(cfg, "model.enforce_eager") if m.enforce_eager is not None else
                            f"default on {'GPU' if gpu else 'CPU'} workers", "model.enforce_eager"))
        out[role] = rows
    return out


def describe_settings(engines: dict[str, list[Setting]]) -> list[str]:
    """The dry run's lines: one per pool, ``setting value (origin)`` separated by ``|``."""
    if not engines:
        return []
    lines = ["engine settings (where from: user, preset, model, default):"]
    for role, rows in engines.items():
        lines.append(f"  {role}: " + " | ".join(f"{s.name} {s.value} ({s.origin})" for s in rows))
    return lines
