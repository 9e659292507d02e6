"""Build the vLLM engine a worker runs: a KV producer (prefill), a KV consumer (decode) or a plain
colocated engine, with the process environment vLLM's CPU backend and NIXL read at start."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pipeline.config import Config, SamplingConfig
from pipeline.metrics import StepRecorder, step_recorder_factory
from pipeline.model import resolve_model_path

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

Role = Literal["prefill", "decode", "colocated"]


def engine_env(cfg: Config, *, cpus: str | None, side_channel: tuple[str, int] | None) -> dict[str, str]:
    """Environment variables for one worker's engine.

    ``cpus`` is a core list for ``VLLM_CPU_OMP_THREADS_BIND`` (``"0"``, ``"0,1"``) or None for
    vLLM's own choice. ``side_channel`` is this worker's NIXL handshake (host, port).
    """
    env = {
        "VLLM_CPU_KVCACHE_SPACE": f"{cfg.model.kv_cache_gib:g}",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if side_channel is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_channel[0]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel[1])
    if cfg.transport.ucx_tls:
        env["UCX_TLS"] = cfg.transport.ucx_tls
    if cfg.transport.ucx_net_devices:
        env["UCX_NET_DEVICES"] = cfg.transport.ucx_net_devices
    return env


def build_engine(cfg: Config, role: Role, *, cpus: str | None,
                 side_channel: tuple[str, int] | None = None,
                 recorder: "StepRecorder | None" = None) -> "AsyncLLM":
    """Start a vLLM ``AsyncLLM`` engine for ``role`` (~30-120 s on 2 CPU cores; longer the first time, while
    torch.compile fills its cache).

    Sets this process's environment first (the engine core is a spawned child that inherits it).
    ``recorder`` receives the engine's per-step scheduler stats (see :mod:`pipeline.metrics`).
    """
    os.environ.update(engine_env(cfg, cpus=cpus, side_channel=side_channel))
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = {}
    if role != "colocated":
        dram = cfg.offload.dram(cfg.model.max_model_len)
        kwargs["kv_transfer_config"] = KVTransferConfig(
            # offload=dram: KV goes through the decode worker's DRAM tier (pipeline.kv.dram_connector);
            # else vLLM's NIXL connector of that name with a progress thread that sleeps in poll()
            # (pipeline.kv.connector).
            kv_connector="DramTierConnector" if dram else cfg.transport.connector,
            kv_connector_module_path="pipeline.kv.dram_connector" if dram else "pipeline.kv.connector",
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


def is_worker_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means this worker cannot go on (its engine died, no decode worker is left),
    as opposed to one row failing. Such an error must not be written down as a row's result: the worker fails, and its
    restart serves the row again."""
    return type(exc).__name__ in {"EngineDeadError", "DecodeUnavailable"}


def parse_cpus(cpus: str) -> set[int]:
    """``"0,2-3"`` -> ``{0, 2, 3}``."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin_descendants(cpus: set[int]) -> None:
    """Confine every thread of this process's descendants (the engine core and its workers) that
    runs outside ``cpus`` to ``cpus``.

    vLLM's NIXL connector on the CPU platform moves the model worker's main thread, which is also
    its OpenMP master thread, to the last core of each NUMA node to "reserve" it for KV
    transfers (``NixlConnectorWorker.__init__``, vLLM 0.32). On one machine every engine then
    computes on that same core and the others idle: measured here, both engines' workers ended
    on core 1 with the prefill engine bound to core 0. Threads created later inherit this mask.
    """
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            for thread in child.threads():
                # Threads already inside the slice keep their own (per-OpenMP-thread) binding.
                if not os.sched_getaffinity(thread.id) <= cpus:
                    os.sched_setaffinity(thread.id, cpus)
        except (psutil.Error, OSError):
            continue


def model_path(cfg: Config) -> str:
    """The model directory (or hub id) every worker loads; converts the bundled model on first use."""
    return resolve_model_path(cfg.model.path, cfg.model.source, cfg.model.name)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@dataclass
class Streamed:
    """What one request produced. ``token_times`` are wall-clock seconds (``time.time()``) at which
    each output token reached this process, one per entry of ``token_ids``."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None


def sampling_params(sampling: SamplingConfig, max_tokens: int | None = None,
                    kv_transfer_params: dict[str, Any] | None = None) -> "SamplingParams":
    """vLLM sampling parameters that stream new tokens only (``DELTA``), optionally carrying
    ``kv_transfer_params`` for the NIXL connector."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None,
    )


class FirstTokenTimeout(TimeoutError):
    """A request produced no output within its first-token deadline (on a decode worker: its KV
    never arrived); vLLM has aborted it."""


async def stream(engine: "AsyncLLM", request_id: str, prompt_token_ids: list[int],
                 params: "SamplingParams", first_token_timeout_s: float | None = None) -> Streamed:
    """Run one request to completion, timestamping every output token as it arrives.

    Raises:
        FirstTokenTimeout: no output within ``first_token_timeout_s`` seconds (the request is
            aborted in the engine, freeing its blocks).
        Exception: whatever vLLM raises for the request (for example a prompt longer than the
            context).
    """
    out = Streamed()
    outputs = aiter(engine.generate({"prompt_token_ids": prompt_token_ids}, params, request_id))
    try:
        first = True
        while True:
            try:
                if first and first_token_timeout_s is not None:
                    ro = await asyncio.wait_for(anext(outputs), first_token_timeout_s)
                else:
                    ro = await anext(outputs)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise FirstTokenTimeout(
                    f"no output within {first_token_timeout_s:g} s of submitting the request") from None
            first = False
            now = time.time()
            completion = ro.outputs[0]
            out.token_ids.extend(completion.token_ids)
            out.token_times.extend([now] * len(completion.token_ids))
            out.text += completion.text
            # num_cached_tokens is reported with the first output; keep the largest value seen.
            out.num_cached_tokens = max(out.num_cached_tokens, ro.num_cached_tokens or 0)
            if ro.finished:
                out.finish_reason = completion.finish_reason
                out.kv_transfer_params = ro.kv_transfer_params
    finally:
        await outputs.aclose()  # aborts the request in the engine if it did not finish
    return out


def load_tokenizer(cfg: Config) -> Any:
    """The model's Hugging Face tokenizer (the one vLLM itself uses)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(cfg))


def kv_bytes_per_token(cfg: Config) -> int:
    """KV bytes per token of the configured model (see :mod:`pipeline.kv.layout`)."""
    from transformers import AutoConfig

    from pipeline.kv.layout import kv_bytes_per_token_from_hf

    hf = AutoConfig.from_pretrained(model_path(cfg)).to_dict()
    hf.update(hf.get("text_config") or {})
    return kv_bytes_per_token_from_hf(hf, cfg.model.dtype)


def kv_capacity_tokens(engine: "AsyncLLM") -> int | None:
    """Tokens the engine's KV cache holds (KV blocks x block size, as vLLM sized it at start;
    None if vLLM did not report it)."""
    cache = engine.vllm_config.cache_config
    if not cache.num_gpu_blocks or not cache.block_size:
        return None
    return int(cache.num_gpu_blocks) * int(cache.block_size)


def worker_id(role: str, index: int) -> str:
    """``"<role>-<index>@<host>"``: names a worker in output rows, logs and the run directory."""
    return f"{role}-{index}@{socket.gethostname()}"


def request_id(key: str, try_: int = 0) -> str:
    """The vLLM request id of row ``key`` ("<shard index>:<row index>") on its ``try_``-th
    prefill (0 first), the same on the prefill and the decode engine: vLLM's NIXL push connector
    pairs the decode side's registration with the prefill side's finished blocks by this id (less
    the random suffix vLLM appends after the last "-"), so it must match on both sides and must not
    contain "-" itself. A retry gets a new id so that it never meets blocks the prefill engine
    still holds for an earlier, abandoned try."""
    return f"row{key}" if try_ == 0 else f"row{key}t{try_}"
