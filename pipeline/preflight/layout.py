"""Each pool its own shape: the tensor parallel size and KV block size of the prefill and decode
engines may differ, and vLLM's NIXL connector re-lays the KV out on the way. Combinations it
cannot carry are refused here, at start, naming both settings (exit 2), instead of by an
assertion inside the connector at the first request, after both pools reported healthy.

The rules are those of vLLM 0.32's NIXL connector and engine (the pinned version):

- An engine of TP ``n`` splits the attention heads over its ranks: the model's attention heads
  must divide by ``n``, and its KV heads must divide by ``n`` or ``n`` by them (then each KV
  head is replicated on ``n / kv_heads`` ranks). vLLM's ``ModelConfig.verify_with_parallel_config``.
- Between the pools the larger TP must be a multiple of the smaller (``TransferTopology.tp_ratio``).
  The side that builds the transfer (decode with ``NixlConnector``, which READs; prefill with
  ``NixlPushConnector``, which WRITEs) cannot take its KV from a peer of larger TP whose KV heads
  are replicated (``_validate_remote_agent_handshake``: ``not (tp_ratio < 0 and is_kv_replicated)``).
- Block sizes: ``TransferTopology.block_size_ratio`` asserts that the local block size is a
  multiple of the remote one. With ``NixlConnector`` only decode checks (it READs), so a decode
  block size that is a multiple of the prefill one passes; with ``NixlPushConnector`` both sides
  check (prefill as it WRITEs, decode at its handshake: "Local block size 128 is not divisible by
  remote block size 256", which kills the decode engine at the first request), so only equal
  sizes pass.
- On vLLM's CPU backend, different block sizes are refused even where the connector takes them:
  it cuts a block into the smaller blocks by bytes, and a CPU block is laid out head by head
  (``[kv_heads, block_size, 2 x head_size]``), so each piece mixes tokens of different heads.
  Measured here (1P:1D pull, prefill blocks of 64 tokens, decode blocks of 128, float32): every
  one of the 24 sample rows differed from colocated generation from its first token, with no
  error anywhere.
- The DRAM tier (``offload=dram``, this project's connector) holds the KV in blocks of one size:
  both pools must use it. It holds every KV head of a block, and each TP rank writes or reads its
  own heads' bytes of it (:mod:`pipeline.engine.dram_pool`), which needs a block laid out head by
  head (vLLM's CPU attention; on GPUs the heads are innermost) and no replicated KV heads (a TP
  size at most the model's KV heads).
- vLLM's attention kernel on CPU takes block sizes that are multiples of 32
  (``CPUAttentionBackend.get_supported_kernel_block_sizes``).

Measured on vLLM's CPU backend (SmolLM2-135M, 3 KV heads, float32, the 24 sample rows): prefill
TP 3 to decode TP 1 and TP 1 to TP 3, each with ``NixlConnector`` and ``NixlPushConnector``, gave
output equal to colocated, with 3 NIXL transfers per row (one per rank of the TP-3 pool) adding up
to the bytes of one TP-1 transfer (``tests/test_engine_kwargs.py``).

A KV cache dtype that differs between the pools is refused with the other per-pool engine
arguments (:data:`pipeline.preflight.engine_args.KV_SHARED`).
"""

from __future__ import annotations

from typing import Any

from pipeline.config import Config, ConfigError
from pipeline.preflight.kv_fit import block_size, hf_config, on_gpu

#: The connector side that builds the transfer, by ``transport.connector``: it checks the other
#: side's block size against its own and may not take KV from a replicated peer.
BUILDER = {"NixlConnector": "decode", "NixlPushConnector": "prefill"}
CPU_BLOCK_MULTIPLE = 32


def _setting(cfg: Config, role: str, what: str) -> str:
    """How the user names ``role``'s ``what`` (``tp`` or ``block_size``), with its value."""
    m = cfg.model
    if what == "tp":  # colocated engines take model.prefill_tp
        return f"model.{'decode' if role == 'decode' else 'prefill'}_tp={m.tp_of(role)}"
    own = getattr(m, f"{role}_block_size", None)
    if own:
        return f"model.{role}_block_size={own}"
    if m.block_size:
        return f"model.block_size={m.block_size} ({role})"
    return f"vLLM's default block size {block_size(cfg, role)} ({role})"


def check_pool_layouts(cfg: Config, hf: dict[str, Any] | None) -> None:
    """Refuse pool shapes vLLM cannot run or its NIXL connector cannot carry (module doc).
    ``hf``: the model's ``config.json`` (its head counts); None skips the checks that need it.

    Raises:
        ConfigError: one line naming the settings involved and why.
    """
    roles = ("colocated",) if cfg.pools.mode == "colocated" else ("prefill", "decode")
    gpu = on_gpu(cfg)
    for role in roles:
        block = block_size(cfg, role)
        if not gpu and block % CPU_BLOCK_MULTIPLE:
            raise ConfigError(f"{_setting(cfg, role, 'block_size')}: vLLM's attention on CPU takes KV blocks of a "
                              f"multiple of {CPU_BLOCK_MULTIPLE} tokens")
    heads = (hf or {}).get("num_attention_heads")
    kv_heads = (hf or {}).get("num_key_value_heads") or heads
    if heads and kv_heads:
        for role in roles:
            tp = cfg.model.tp_of(role)
            if heads % tp or (kv_heads % tp and tp % kv_heads):
                raise ConfigError(
                    f"{_setting(cfg, role, 'tp')}: the model has {heads} attention heads and {kv_heads} KV heads; "
                    f"a TP size must divide the attention heads, and divide the KV heads or be a multiple of them "
                    f"(TP sizes that work here: {', '.join(map(str, _tp_sizes(heads, kv_heads)))})")
    if roles == ("colocated",):
        return
    tps = {r: cfg.model.tp_of(r) for r in ("prefill", "decode")}
    if cfg.offload.dram(cfg.model.max_model_len) and max(tps.values()) > 1:
        both = f"{_setting(cfg, 'prefill', 'tp')} and {_setting(cfg, 'decode', 'tp')}"
        if gpu:
            raise ConfigError(f"{both} with the DRAM tier (offload=dram, or offload=auto at this context): each TP "
                              "rank writes its own KV heads' bytes of a block, which on GPU workers lie spread through "
                              "the block (heads innermost); use TP 1 for both pools with the tier, or offload=none")
        if kv_heads and max(tps.values()) > kv_heads:
            raise ConfigError(f"{both} with the DRAM tier: a TP size above the model's {kv_heads} KV heads "
                              "replicates them over ranks, which the tier's one layout does not take; lower it "
                              f"to at most {kv_heads}, or offload=none")
    builder = BUILDER.get(cfg.transport.connector, "decode")
    peer = "prefill" if builder == "decode" else "decode"
    reads = "READs" if builder == "decode" else "WRITEs"
    how = f"with transport.connector={cfg.transport.connector} ({builder} {reads})"
    if max(tps.values()) % min(tps.values()):
        raise ConfigError(f"{_setting(cfg, 'prefill', 'tp')} and {_setting(cfg, 'decode', 'tp')}: the larger TP size "
                          "must be a multiple of the smaller, so that each rank's KV heads come from whole ranks of "
                          "the other pool (vLLM's NIXL connector)")
    if kv_heads and tps[peer] > tps[builder] and tps[peer] > kv_heads:
        raise ConfigError(
            f"{_setting(cfg, 'prefill', 'tp')} and {_setting(cfg, 'decode', 'tp')} {how}: the {peer} pool's TP is "
            f"larger than the {builder} pool's and above the model's {kv_heads} KV heads (its KV heads are "
            f"replicated), which vLLM's NIXL connector does not take; lower {_setting(cfg, peer, 'tp')} to at "
            f"most {kv_heads}, or raise the {builder} pool's")
    blocks = {r: block_size(cfg, r) for r in ("prefill", "decode")}
    if blocks["prefill"] != blocks["decode"]:
        both = f"{_setting(cfg, 'prefill', 'block_size')} and {_setting(cfg, 'decode', 'block_size')}"
        if cfg.offload.dram(cfg.model.max_model_len):
            raise ConfigError(f"{both}: the DRAM tier (offload=dram) holds the KV in blocks of one size; give both "
                              "pools the same block size, or offload=none")
        if builder == "prefill":
            raise ConfigError(f"{both} {how}: vLLM's push connector checks the block sizes on both sides (each must "
                              "be a multiple of the other), so the pools need the same block size; or use "
                              "transport=nixl_pull with a decode block size that is a multiple of the prefill one")
        if blocks["decode"] % blocks["prefill"]:
            raise ConfigError(f"{both} {how}: the decode block size must be a multiple of the prefill one (vLLM's NIXL "
                              "connector reads whole prefill blocks into each decode block); swap them")
        if not gpu:
            raise ConfigError(f"{both}: on CPU workers the pools need the same block size: vLLM's NIXL connector "
                              "cuts a decode block into prefill blocks by bytes, and vLLM's CPU KV blocks are laid "
                              "out head by head, so the KV would arrive scrambled (every row's output wrong, with "
                              "no error)")


def _tp_sizes(heads: int, kv_heads: int) -> list[int]:
    return [n for n in range(1, heads + 1) if not heads % n and (not kv_heads % n or not n % kv_heads)]


def check_pool_layouts_of(cfg: Config, model_dir: str | None) -> None:
    """:func:`check_pool_layouts` with the head counts from ``model_dir/config.json`` (None, or
    no such file: without them)."""
    check_pool_layouts(cfg, hf_config(model_dir))
