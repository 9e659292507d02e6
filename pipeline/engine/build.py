"""Build the vLLM engine a worker runs: a KV producer (prefill), a KV consumer (decode) or a plain
colocated engine, with the process environment vLLM's CPU backend and NIXL read at start."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from pipeline.config import Config
from pipeline.engine.env import engine_env, parse_cpus, pin_descendants
from pipeline.engine.model import model_path
from pipeline.engine.steps import StepRecorder, step_recorder_factory

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

Role = Literal["prefill", "decode", "colocated"]


def build_engine(cfg: Config, role: Role, *, cpus: str | None,
                 side_channel: tuple[str, int] | None = None,
                 recorder: "StepRecorder | None" = None) -> "AsyncLLM":
    """Start a vLLM ``AsyncLLM`` engine for ``role`` (~30-120 s on 2 CPU cores; longer the first time, while
    torch.compile fills its cache).

    Sets this process's environment first (the engine core is a spawned child that inherits it).
    ``recorder`` receives the engine's per-step scheduler stats (see :mod:`pipeline.engine.steps`).
    """
    os.environ.update(engine_env(cfg, cpus=cpus, side_channel=side_channel))
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = {}
    if role != "colocated":
        dram = cfg.offload.dram(cfg.model.max_model_len)
        kwargs["kv_transfer_config"] = KVTransferConfig(
            # offload=dram: KV goes through the decode worker's DRAM tier (pipeline.engine.dram_connector);
            # else vLLM's NIXL connector of that name with a progress thread that sleeps in poll()
            # (pipeline.engine.connector).
            kv_connector="DramTierConnector" if dram else cfg.transport.connector,
            kv_connector_module_path="pipeline.engine.dram_connector" if dram else "pipeline.engine.connector",
            kv_connector_extra_config={"progress_delay_us": cfg.transport.nixl_progress_delay_us},
            kv_role="kv_producer" if role == "prefill" else "kv_consumer",
            kv_buffer_device="cpu" if _on_cpu() else "cuda",
        )
    if cfg.model.block_size:
        kwargs["block_size"] = cfg.model.block_size
    if role == "prefill" and cfg.offload.dram(cfg.model.max_model_len):
        # With async scheduling the engine schedules step N+1 before it has processed step N's
        # output, so a request that finished in step N gets its blocks written only after step
        # N+1's forward pass: one whole prefill chunk later (seconds on a CPU). Scheduled in
        # step, the write starts before the very next forward pass.
        kwargs["async_scheduling"] = False
    if role == "decode" and cfg.model.decode_kv_blocks:
        kwargs["num_gpu_blocks_override"] = cfg.model.decode_kv_blocks
    if role == "prefill" and cfg.model.prefill_chunk_tokens:
        kwargs["max_num_batched_tokens"] = cfg.model.prefill_chunk_tokens
    tp = cfg.model.decode_tp if role == "decode" else cfg.model.prefill_tp
    args = AsyncEngineArgs(
        model=model_path(cfg),
        dtype=cfg.model.dtype,
        max_model_len=cfg.model.max_model_len,
        tensor_parallel_size=tp,
        gpu_memory_utilization=cfg.model.gpu_memory_utilization,
        enforce_eager=cfg.model.enforce_eager,
        seed=0,
        disable_log_stats=True,
        **kwargs,
    )
    loggers = [step_recorder_factory(recorder)] if recorder is not None else None
    engine = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
    if cpus is not None:
        pin_descendants(parse_cpus(cpus))
    return engine


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
