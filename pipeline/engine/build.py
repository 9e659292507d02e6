"""Build the vLLM engine a worker runs: a KV producer (prefill), a KV consumer (decode) or a plain
colocated engine, with the process environment vLLM's CPU backend and NIXL read at start.

The engine's arguments (vLLM's ``AsyncEngineArgs``), lowest precedence first:

0. the pipeline's defaults for a role (:data:`ROLE_DEFAULTS`), which any of the dicts below may
   change;
1. ``model.engine_kwargs``: any ``AsyncEngineArgs`` field, for every engine;
2. ``model.prefill_engine_kwargs`` / ``model.decode_engine_kwargs``: that pool's engines only
   (colocated engines take ``model.engine_kwargs`` only);
3. the pipeline's per-role settings (:data:`ROLE_SETTINGS`: ``model.prefill_chunk_tokens``,
   ``model.decode_kv_blocks``, the DRAM tier's ``async_scheduling``);
4. the arguments the pipeline owns (:data:`OWNED`), always last.

:mod:`pipeline.preflight.engine_args` refuses at start what would be overridden silently: a field
of :data:`OWNED` in any of the dicts, and a field of :data:`ROLE_SETTINGS` set both ways to
different values.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from pipeline.config import Config
from pipeline.engine.env import engine_env, parse_cpus, pin_worker, pinned_descendants, worker_pin
from pipeline.engine.lora import lora_engine_kwargs
from pipeline.engine.model import model_path
from pipeline.engine.nixl_agent import DEFAULT_PTHR_DELAY_US
from pipeline.engine.reaper import EngineReaper
from pipeline.engine.steps import StepRecorder, step_recorder_factory

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

Role = Literal["prefill", "decode", "colocated"]

#: NIXL's progress-thread ``poll()`` timeout (microseconds) when ``transport.nixl_progress_delay_us``
#: is null. On vLLM's CPU platform the thread wakes on the core where the model's forward pass runs
#: (an engine's cores are its worker's), and at 1 ms its 1,000 wake-ups a second made a decode
#: step 1.12x a colocated engine's at 8 rows; at 20 ms 1.01x, and a KV transfer is no slower, as
#: the thread wakes at once on a UCX event (BENCHMARKS.md, "The P/D engines' slower step", with
#: ``tools/bench_step.py``). On a GPU the forward pass does not run on that core: 1 ms there.
GPU_PROGRESS_DELAY_US = DEFAULT_PTHR_DELAY_US
CPU_PROGRESS_DELAY_US = 20000

#: ``gpu_memory_utilization`` when ``model.gpu_memory_utilization`` is null: vLLM's own default on
#: a GPU; on vLLM's CPU platform a low share (0.3 worked, vLLM's 0.92 refuses to start: DESIGN.md
#: section 2), the KV cache there being ``model.kv_cache_gib``.
GPU_MEMORY_UTILIZATION = 0.9
CPU_MEMORY_UTILIZATION = 0.3

# The reapers of this process's engines (pipeline.engine.reaper), held for the process's life: a
# reaper whose pipe is closed (its object collected) would end the engine.
_REAPERS: list = []

#: ``AsyncEngineArgs`` fields the pipeline sets itself (:func:`pipeline_engine_kwargs`,
#: :func:`build_engine`) or leaves at vLLM's default because it relies on it, with the setting to
#: use instead and why; refused in ``model.*engine_kwargs``.
OWNED = {
    "model": "use model.path (or model.source): every worker of the run loads the same model",
    "tokenizer": "the pipeline renders and tokenizes prompts with the model's own tokenizer (model.path) and "
                 "hands the engine token ids; an engine with another tokenizer would read them as other text",
    "skip_tokenizer_init": "the pipeline reads each generation's text from the engine (it detokenizes)",
    "dtype": "use model.dtype: prefill and decode must compute the KV in the same element type",
    "max_model_len": "use model.max_model_len: prompts are checked (or truncated) against it before any engine",
    "tensor_parallel_size": "use model.prefill_tp / model.decode_tp: the launcher sizes each worker's devices from them",
    "gpu_memory_utilization": "use model.gpu_memory_utilization",
    "enforce_eager": "use model.enforce_eager",
    "block_size": "use model.block_size (or model.prefill_block_size / model.decode_block_size): the KV's "
                  "re-layout between the pools is checked at start against them",
    "seed": "use model.seed",
    "disable_log_stats": "the pipeline records every engine step itself (RUN_DIR/metrics/workers)",
    "kv_transfer_config": "transport= and offload= choose the KV connector; the role of each engine in it is its pool's",
    **{key: "use model.lora (name: adapter directory): the pipeline enables LoRA and sizes it for those adapters, "
            "the same on every engine" for key in ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")},
}

#: Fields the pipeline sets for one role from its own settings: ``{role: {field: setting}}``. The
#: field may still come through ``model.*engine_kwargs`` when the setting is not in use; both at
#: once, to different values, is refused at start.
ROLE_SETTINGS = {
    "prefill": {"max_num_batched_tokens": "model.prefill_chunk_tokens",
                "async_scheduling": "offload=dram (the DRAM tier needs it off on prefill)"},
    "decode": {"num_gpu_blocks_override": "model.decode_kv_blocks"},
    "colocated": {},
}


#: Fields the pipeline sets for one role unless ``model.*engine_kwargs`` set them:
#: ``{role: {field: (value, why)}}``.
ROLE_DEFAULTS = {
    "prefill": {
        # With async scheduling the engine schedules step N+1 before it has processed step N's
        # output: a prefill that ended in step N reaches its worker (and its KV the decode
        # worker) only after step N+1's forward pass, a whole prefill chunk later (seconds on
        # a CPU; BENCHMARKS.md, "Hand-off"). A prefill engine's steps are long, so scheduling
        # them in step costs nothing measurable.
        "async_scheduling": (False, "a finished prefill leaves at the end of its own step"),
    },
    "decode": {},
    "colocated": {},
}


def kwargs_settings(role: Role) -> tuple[str, ...]:
    """The ``model.*`` settings whose engine kwargs reach an engine of ``role``, lowest precedence
    first: ``model.engine_kwargs``, then the pool's own (none for colocated engines)."""
    return ("model.engine_kwargs",) if role == "colocated" else ("model.engine_kwargs", f"model.{role}_engine_kwargs")


def user_engine_kwargs(cfg: Config, role: Role) -> dict[str, tuple[Any, str]]:
    """The user's engine arguments for ``role`` merged (see :func:`kwargs_settings`), each as
    ``(value, setting it came from)``."""
    merged: dict[str, tuple[Any, str]] = {}
    for setting in kwargs_settings(role):
        for key, value in getattr(cfg.model, setting.split(".", 1)[1]).items():
            merged[key] = (value, setting)
    return merged


def role_engine_kwargs(cfg: Config, role: Role) -> dict[str, Any]:
    """The fields of :data:`ROLE_SETTINGS` the pipeline sets for ``role`` with this config."""
    out: dict[str, Any] = {}
    if role == "prefill" and cfg.model.prefill_chunk_tokens:
        out["max_num_batched_tokens"] = cfg.model.prefill_chunk_tokens
    if role == "prefill" and cfg.offload.dram(cfg.model.max_model_len):
        # As in ROLE_DEFAULTS, but required: with async scheduling a request that finished in
        # step N gets its blocks written only after step N+1's forward pass. Scheduled in step,
        # the write starts before the very next forward pass.
        out["async_scheduling"] = False
    if role == "decode" and cfg.model.decode_kv_blocks:
        out["num_gpu_blocks_override"] = cfg.model.decode_kv_blocks
    return out


def pipeline_engine_kwargs(cfg: Config, role: Role) -> dict[str, Any]:
    """The fields of :data:`OWNED` for ``role``, except ``model`` (:func:`model_path`, which
    converts the bundled model on first use) and ``kv_transfer_config`` (a vLLM object)."""
    out: dict[str, Any] = {
        "dtype": cfg.model.dtype,
        "max_model_len": cfg.model.max_model_len,
        "tensor_parallel_size": cfg.model.tp_of(role),
        "gpu_memory_utilization": memory_utilization(cfg),
        "enforce_eager": enforce_eager(cfg),
        "seed": cfg.model.seed,
        "disable_log_stats": True,
    }
    if cfg.model.block_size_of(role):
        out["block_size"] = cfg.model.block_size_of(role)
    return {**out, **lora_engine_kwargs(cfg)}


def engine_kwargs(cfg: Config, role: Role, model: str) -> dict[str, Any]:
    """Every ``AsyncEngineArgs`` keyword for an engine of ``role`` loading ``model`` (a directory
    or hub id), merged in the order of the module doc, without ``kv_transfer_config``."""
    defaults = {key: value for key, (value, _) in ROLE_DEFAULTS[role].items()}
    merged = {key: value for key, (value, _) in user_engine_kwargs(cfg, role).items()}
    return {**defaults, **merged, **role_engine_kwargs(cfg, role), **pipeline_engine_kwargs(cfg, role), "model": model}


def build_engine(cfg: Config, role: Role, *, cpus: str | None,
                 side_channel: tuple[str, int] | None = None,
                 recorder: "StepRecorder | None" = None) -> "AsyncLLM":
    """Start a vLLM ``AsyncLLM`` engine for ``role`` (~30-120 s on 2 CPU cores; longer the first time, while
    torch.compile fills its cache), with the arguments of :func:`engine_kwargs`.

    Sets this process's environment first (the engine core is a spawned child that inherits it).
    ``recorder`` receives the engine's per-step scheduler stats (see :mod:`pipeline.engine.steps`).

    Raises:
        Exception: whatever vLLM raises for arguments it refuses or an engine that fails to start
            (the checks at start, :mod:`pipeline.preflight.engine_args`, catch most of the first).
    """
    os.environ.update(engine_env(cfg, cpus=cpus, side_channel=side_channel, tp=cfg.model.tp_of(role)))
    if (own := worker_pin(cfg, role, cpus)) is not None:
        pin_worker(own)  # with its engine, not on the cores it was started on (worker_pin)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = engine_kwargs(cfg, role, model_path(cfg))
    if role != "colocated":
        kwargs["kv_transfer_config"] = kv_transfer_config(cfg, role)
    args = AsyncEngineArgs(**kwargs)
    loggers = [step_recorder_factory(recorder)] if recorder is not None else None
    # Without a core list of its own the engine stays on the cores this worker was given (Slurm's
    # allocation, a taskset): vLLM's CPU binding follows them, but its NIXL connector moves the
    # model worker's main thread to the machine's last core, outside them (pinned_descendants).
    # Its processes are named to a reaper as they appear: they end with this worker, however it
    # ends (pipeline.engine.reaper).
    reaper = EngineReaper()
    _REAPERS.append(reaper)
    with pinned_descendants(parse_cpus(cpus) if cpus is not None else os.sched_getaffinity(0),
                            each_pass=reaper.watch_descendants):
        return AsyncLLM.from_engine_args(args, stat_loggers=loggers)


def engine_shape(engine: "AsyncLLM") -> dict[str, int | bool]:
    """What ``engine`` runs with, for its record in the run directory: ``tp``, ``block_size`` and
    ``max_model_len`` (tokens) and ``enforce_eager`` as vLLM resolved them (its ``VllmConfig``),
    and ``worker_processes``, the vLLM
    model-worker processes (``VLLM::Worker``) under this process, counted from the operating
    system: one per TP rank."""
    import psutil

    vc = engine.vllm_config
    workers = 0
    for child in psutil.Process().children(recursive=True):
        try:
            workers += child.name().startswith("VLLM::Worker")
        except psutil.Error:
            continue
    return {"tp": vc.parallel_config.tensor_parallel_size, "block_size": vc.cache_config.block_size,
            "max_model_len": vc.model_config.max_model_len, "enforce_eager": vc.model_config.enforce_eager,
            "worker_processes": workers}


# Seconds vLLM waits for an engine core to exit after SIGTERM before it kills its process tree.
# vLLM's default is 5 s; here every engine core outlived it (its worker process alone takes ~3 s
# to exit after its teardown, in native finalizers), so every run spent 5 s per engine on a kill
# that came anyway. A worker stops its engine only after its rows are durable in the run dir.
ENGINE_STOP_GRACE_S = 1.0


def stop_engine(engine: "AsyncLLM") -> None:
    """Stop ``engine`` (its engine core and worker processes), waiting at most
    :data:`ENGINE_STOP_GRACE_S` seconds before vLLM kills what is left. Call it after the
    worker's output is written: nothing the engine still holds is needed."""
    engine.shutdown(timeout=ENGINE_STOP_GRACE_S)


def kv_transfer_config(cfg: Config, role: Literal["prefill", "decode"]):
    """vLLM's ``KVTransferConfig`` for an engine of ``role``: the connector (``offload=dram``:
    the DRAM tier's, :mod:`pipeline.engine.dram_connector`; else vLLM's NIXL connector named by
    ``transport.connector``, :mod:`pipeline.engine.connector`) and its extra config: NIXL's
    progress-thread delay (microseconds), the pause of a prefill engine's empty steps
    (seconds, :mod:`pipeline.engine.idle`), and whether a pull decode engine READs a hand-off's
    KV in the step that schedules it (:mod:`pipeline.engine.sync_load`, waiting at most
    ``transport.kv_timeout_s``), and how long a decode engine keeps the blocks of a hand-off it gave
    up on (``transport.abort_reclaim_s``, :mod:`pipeline.engine.reclaim`). A KV load that fails ends its request with
    ``finish_reason="error"`` (``kv_load_failure_policy="fail"``): the decode worker hands the row
    back to its prefill worker, which prefills it again (:mod:`pipeline.roles.handoff`)."""
    from vllm.config import KVTransferConfig

    dram = cfg.offload.dram(cfg.model.max_model_len)
    return KVTransferConfig(
        kv_connector="DramTierConnector" if dram else cfg.transport.connector,
        kv_connector_module_path="pipeline.engine.dram_connector" if dram else "pipeline.engine.connector",
        kv_connector_extra_config={"progress_delay_us": progress_delay_us(cfg),
                                   "idle_pause_s": cfg.transport.prefill_idle_pause_ms / 1e3,
                                   "sync_kv_load": cfg.transport.sync_kv_load,
                                   "kv_timeout_s": cfg.transport.kv_timeout_s,
                                   "abort_reclaim_s": cfg.transport.abort_reclaim_s},
        kv_role="kv_producer" if role == "prefill" else "kv_consumer",
        kv_load_failure_policy="fail",
        kv_buffer_device="cpu" if _on_cpu() else "cuda",
    )


def memory_utilization(cfg: Config) -> float:
    """vLLM's ``gpu_memory_utilization`` for this config's engines: ``model.gpu_memory_utilization``
    when set, else :data:`GPU_MEMORY_UTILIZATION` on a GPU and :data:`CPU_MEMORY_UTILIZATION` on
    vLLM's CPU platform (where vLLM refuses its own default, DESIGN.md section 2)."""
    if cfg.model.gpu_memory_utilization is not None:
        return cfg.model.gpu_memory_utilization
    return CPU_MEMORY_UTILIZATION if _on_cpu() else GPU_MEMORY_UTILIZATION


def progress_delay_us(cfg: Config) -> int:
    """NIXL's progress-thread ``poll()`` timeout for this config's agents, in microseconds:
    ``transport.nixl_progress_delay_us`` when set, else :data:`CPU_PROGRESS_DELAY_US` on vLLM's
    CPU platform and :data:`GPU_PROGRESS_DELAY_US` on a GPU."""
    if cfg.transport.nixl_progress_delay_us is not None:
        return cfg.transport.nixl_progress_delay_us
    return CPU_PROGRESS_DELAY_US if _on_cpu() else GPU_PROGRESS_DELAY_US


def enforce_eager(cfg: Config) -> bool:
    """vLLM's ``enforce_eager`` for this config's engines: ``model.enforce_eager`` when set, else
    eager on vLLM's CPU platform and CUDA graphs on a GPU (the schema's comment says why)."""
    return cfg.model.enforce_eager if cfg.model.enforce_eager is not None else _on_cpu()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
