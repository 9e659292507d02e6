"""Preflight: the vLLM engine arguments of ``model.engine_kwargs``, ``model.prefill_engine_kwargs``
and ``model.decode_engine_kwargs`` (merged by :func:`pipeline.engine.build.engine_kwargs`).

:func:`check_engine_args` refuses, each failure one line naming the setting:

- a name that is not a field of vLLM's ``AsyncEngineArgs`` (the closest field names are given);
- a field the pipeline sets itself (:data:`pipeline.engine.build.OWNED`), with the setting to use
  instead and why;
- a value of the wrong type for the field: validated with pydantic against the field's
  annotation, as vLLM's config classes validate it (``max_num_seqs='abc'``, a ``kv_cache_dtype``
  vLLM does not know, an unknown key of ``compilation_config``);
- a field set for a pool both here and by the pipeline's own setting for that pool, to different
  values (:data:`pipeline.engine.build.ROLE_SETTINGS`: ``model.prefill_chunk_tokens`` against
  ``max_num_batched_tokens``, ``model.decode_kv_blocks`` against ``num_gpu_blocks_override``);
- disaggregated pools: prefill and decode engines that would disagree on a field of
  :data:`KV_SHARED` (how the KV is laid out, or what computes it), naming both settings; and a
  ``kv_cache_dtype`` other than ``model.dtype`` with the DRAM tier (``offload=dram``), whose slots
  are sized from ``model.dtype``;
- what vLLM's own validation refuses (``AsyncEngineArgs.create_engine_config``, about 1.5 s, no
  engine: ``max_num_seqs=0``, ``max_num_batched_tokens`` below ``max_num_seqs``, ...), for each
  pool that runs, when the model is a local directory here (never downloaded or converted for
  this) and the pipeline's own arguments pass the same validation on this machine (a login node
  without the workers' devices refuses nothing): where vLLM refuses those, a warning names the
  settings left unchecked and vLLM's error, and the engines check them at start.

Nothing is imported from vLLM when the three dicts are empty. Importing it (5-10 s) sets process
environment variables (``LD_PRELOAD`` ...); they are restored, so that workers started from this
process do not inherit them. Where vLLM does not import at all, only the checks that need none of
it run (owned fields, the pools' own settings, agreement); the engines check the rest at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.config import Config, ConfigError
from pipeline.engine.build import (
    OWNED, ROLE_SETTINGS, Role, engine_kwargs, kwargs_settings, pipeline_engine_kwargs, role_engine_kwargs,
    user_engine_kwargs,
)
from pipeline.engine.lora import ADAPTER_WEIGHTS, VLLM_RANKS, adapter_rank
from pipeline.model.resolve import ModelNotFound, cache_dir, find_model
from pipeline.preflight.locations import one_line

#: ``AsyncEngineArgs`` fields that decide the KV a token gets (its layout, or the model that
#: computes it): decode reads prefill's KV as if it had computed it, so both pools must agree.
#: ``dtype`` and ``block_size`` are owned (``model.dtype``, ``model.block_size``) and shared anyway.
KV_SHARED = {
    "kv_cache_dtype": "the KV cache's element type",
    "kv_cache_dtype_skip_layers": "the layers whose KV keeps the model's dtype",
    "attention_backend": "the KV block layout (each attention backend has its own)",
    "attention_config": "the KV block layout (it selects the attention backend)",
    "quantization": "the weights that compute the KV",
    "quantization_config": "the weights that compute the KV",
    "load_format": "the weights that compute the KV",
    "model_weights": "the weights that compute the KV",
    "revision": "the weights that compute the KV",
    "code_revision": "the model code that computes the KV",
    "hf_overrides": "the model's shape (layers, heads) and so the KV layout",
    "hf_config_path": "the model's shape (layers, heads) and so the KV layout",
    "mamba_cache_dtype": "the state cache's element type",
    "mamba_ssm_cache_dtype": "the state cache's element type",
    "mamba_block_size": "the state cache's block size",
}
_DICTS = ("model.engine_kwargs", "model.prefill_engine_kwargs", "model.decode_engine_kwargs")

log = logging.getLogger(__name__)


def check_lora(cfg: Config) -> None:
    """Check ``model.lora``: each adapter a PEFT adapter directory on this host with a rank vLLM
    serves (:func:`pipeline.engine.lora.adapter_rank`).

    Raises:
        ConfigError: ``model.lora.NAME: ...`` (no such directory, no ``adapter_config.json``, no
            rank, a rank above 512, no weights file).
    """
    for name, path in cfg.model.lora.items():
        key = f"model.lora.{name}"
        if not isinstance(path, str) or not Path(path).is_dir():
            raise ConfigError(f"{key}: {path!r} is not a directory (a PEFT LoRA adapter: adapter_config.json and weights)")
        try:
            rank = adapter_rank(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if rank > VLLM_RANKS[-1]:
            raise ConfigError(f"{key}: rank {rank} is above the largest vLLM serves ({VLLM_RANKS[-1]})")
        if not any((Path(path) / f).is_file() for f in ADAPTER_WEIGHTS):
            raise ConfigError(f"{key}: {path} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")


def check_engine_args(cfg: Config) -> None:
    """Check the engine arguments of ``cfg`` (see the module doc); returns at once when none is
    set. Cost: vLLM's import (5-10 s) and up to four ``create_engine_config`` calls (~1.5 s for
    the first, milliseconds after) when some are set. The checks that import vLLM run on a
    thread of their own (:func:`_off_the_callers_stack`).

    Raises:
        ConfigError: one line naming the setting (``model.engine_kwargs.max_num_seq: ...``).
    """
    check_lora(cfg)
    if not any(getattr(cfg.model, d.split(".", 1)[1]) for d in _DICTS) and not cfg.model.lora:
        return
    _off_the_callers_stack(_check_with_fields, cfg)


def _off_the_callers_stack(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` on a thread of its own; its exception is raised here.

    Some of vLLM's modules keep an exception raised while they were imported
    (``vllm.multimodal.media.audio`` keeps torchcodec's ``ImportError`` in a module global), and
    with its traceback every frame of the stack that imported them, locals included. Imported
    from the launcher's stack, that kept the run's submitit jobs alive until the interpreter shut
    down, where submitit's ``LocalJob.__del__`` fails (``TypeError: 'NoneType' object is not
    callable``, printed after every run that set an engine argument). A thread's stack holds
    only this call."""
    failed: list[BaseException] = []

    def call() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 -- raised again on the caller's thread
            failed.append(exc)

    t = threading.Thread(target=call, name="preflight-engine-args")
    t.start()
    t.join()
    if failed:
        raise failed[0]


def _check_with_fields(cfg: Config) -> None:
    with _vllm_quietly():
        try:
            fields = _fields()
        except Exception:  # noqa: BLE001 -- no vLLM on this host (a login node): its workers check at start
            fields = None
        for setting in _DICTS:
            for key, value in getattr(cfg.model, setting.split(".", 1)[1]).items():
                _check_one(f"{setting}.{key}", key, value, fields)
        # pools=auto: either layout may run
        roles: tuple[Role, ...] = {"disaggregated": ("prefill", "decode"), "colocated": ("colocated",)}.get(
            cfg.pools.mode, ("prefill", "decode", "colocated"))
        for role in roles:
            _check_role_settings(cfg, role)
        if cfg.pools.mode != "colocated":
            _check_kv_shared(cfg, fields)
        model = local_model(cfg)
        if model is not None and fields is not None:
            unchecked: dict[str, list[Role]] = {}  # vLLM's error -> the roles it left unchecked
            for role in roles:
                why = _check_with_vllm(cfg, role, model)
                if why is not None:
                    unchecked.setdefault(why, []).append(role)
            for why, skipped in unchecked.items():
                settings = " / ".join(dict.fromkeys(
                    s for r in skipped for s in kwargs_settings(r) if getattr(cfg.model, s.split(".", 1)[1])))
                log.warning("%s: not checked by vLLM's own validation here: vLLM refuses even the pipeline's own "
                            "arguments for the %s engines on this machine (%s); the engines check them when they "
                            "start", settings or "model.lora", " and ".join(skipped), why)


def _check_one(setting: str, key: str, value: Any, fields: dict[str, dataclasses.Field] | None) -> None:
    """One ``setting`` = ``value``: not owned, and (``fields``: vLLM's, when it imports here) a
    known field of the right type."""
    if key in OWNED:
        raise ConfigError(f"{setting}: set by the pipeline; {OWNED[key]}")
    if fields is None:
        return
    if key not in fields:
        close = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else "see vllm.engine.arg_utils.AsyncEngineArgs"
        raise ConfigError(f"{setting}: not a vLLM engine argument (a field of AsyncEngineArgs); {hint}")
    adapter = _adapter(key)
    if adapter is None:  # an annotation pydantic cannot check: vLLM checks the value at engine start
        return
    try:
        adapter.validate_python(value)
    except Exception as exc:  # noqa: BLE001 -- pydantic.ValidationError, or a validator's own error
        raise ConfigError(f"{setting}: vLLM refuses {value!r} for {key}: {_message(exc)}") from None


def _check_role_settings(cfg: Config, role: Role) -> None:
    """A field the pipeline sets for ``role`` from its own setting, set to another value here."""
    ours = role_engine_kwargs(cfg, role)
    for key, (value, setting) in user_engine_kwargs(cfg, role).items():
        if key in ours and ours[key] != value:
            raise ConfigError(f"{setting}.{key}={value!r} conflicts with {ROLE_SETTINGS[role][key]}, which sets the "
                              f"{role} engines' {key} to {ours[key]!r}: keep one")
        if (key == "kv_cache_dtype" and role != "colocated" and cfg.offload.dram(cfg.model.max_model_len)
                and value not in (None, "auto", cfg.model.dtype)):
            raise ConfigError(f"{setting}.kv_cache_dtype={value!r}: the DRAM tier (offload=dram) sizes its slots "
                              f"from model.dtype={cfg.model.dtype}; use offload=none with another KV cache dtype")


def _check_kv_shared(cfg: Config, fields: dict[str, dataclasses.Field] | None) -> None:
    """Prefill and decode agree on every field of :data:`KV_SHARED` (an unset field is vLLM's
    default; None when vLLM does not import here)."""
    prefill, decode = user_engine_kwargs(cfg, "prefill"), user_engine_kwargs(cfg, "decode")
    for key, why in KV_SHARED.items():
        if key not in prefill and key not in decode:
            continue
        field = (fields or {}).get(key)
        default = (None if field is None else field.default_factory()
                   if field.default_factory is not dataclasses.MISSING else field.default)
        sides = []
        for role, merged in (("prefill", prefill), ("decode", decode)):
            value, setting = merged.get(key, (default, None))
            sides.append((value, f"{setting}.{key}={value!r}" if setting else
                          f"the {role} engines' {key} (unset: vLLM's default {value!r})"))
        if sides[0][0] != sides[1][0]:
            raise ConfigError(f"{sides[0][1]} and {sides[1][1]} differ: prefill and decode must agree on {why}; "
                              f"set it once in model.engine_kwargs")


def _check_with_vllm(cfg: Config, role: Role, model: str) -> str | None:
    """vLLM's own validation of ``role``'s merged arguments (no engine), when it accepts the
    pipeline's own arguments on this machine. Returns None when checked, else vLLM's error
    refusing the pipeline's own arguments (one line): nothing was checked.

    Raises:
        ConfigError: vLLM refuses the merged arguments (the settings named, with vLLM's error).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        AsyncEngineArgs(**role_engine_kwargs(cfg, role), **pipeline_engine_kwargs(cfg, role),
                        model=model).create_engine_config()
    except Exception as exc:  # noqa: BLE001 -- this machine cannot validate even the pipeline's own arguments
        return _message(exc)
    try:
        AsyncEngineArgs(**engine_kwargs(cfg, role, model)).create_engine_config()
    except Exception as exc:  # noqa: BLE001 -- vLLM raises ValueError, pydantic errors, TypeError ...
        settings = " / ".join(kwargs_settings(role))
        raise ConfigError(f"{settings}: vLLM refuses the {role} engines' arguments: {_message(exc)}") from None
    return None


def local_model(cfg: Config) -> str | None:
    """The model's folder on this machine: ``model.path`` found as a folder or a hub id in the
    local Hugging Face cache (:func:`~pipeline.model.resolve.find_model`), or the bundled model
    once converted (None before its first real run converts it).

    Raises:
        ConfigError: ``model.path`` is not found (the message says how to fetch a hub id), or its
            folder holds no ``config.json`` (every check of the model's shape reads it).
    """
    if cfg.model.path:
        try:
            folder = find_model(cfg.model.path)
        except ModelNotFound as exc:
            raise ConfigError(str(exc)) from None
        if not (Path(folder) / "config.json").is_file():
            raise ConfigError(f"model.path: {folder} holds no config.json: not a Hugging Face model folder")
        return folder
    converted = cache_dir() / "models" / cfg.model.name
    return str(converted) if (converted / "config.json").is_file() else None


def _message(exc: BaseException) -> str:
    """A pydantic error as ``where: what`` per error; any other exception on one line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join(f"{'.'.join(map(str, e['loc'])) + ': ' if e.get('loc') else ''}{e['msg']}"
                             for e in errors())
        except Exception:  # noqa: BLE001 -- not pydantic's errors() after all
            pass
    return one_line(exc)


@contextlib.contextmanager
def _vllm_quietly() -> Iterator[None]:
    """Import vLLM's arguments with its logging at ERROR, and leave ``os.environ`` as it was."""
    saved = dict(os.environ)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vLLM is first imported
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        vllm_logger.setLevel(level)
        os.environ.clear()
        os.environ.update(saved)


@functools.lru_cache(maxsize=None)
def _fields() -> dict[str, dataclasses.Field]:
    """The public fields of vLLM's ``AsyncEngineArgs`` by name."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return {f.name: f for f in dataclasses.fields(AsyncEngineArgs) if not f.name.startswith("_")}


@functools.lru_cache(maxsize=None)
def _adapter(key: str) -> Any:
    """A pydantic ``TypeAdapter`` for field ``key``'s annotation; None when pydantic cannot build
    one (``torch.dtype``, a name vLLM imports for type checkers only)."""
    import pydantic

    annotation = _fields()[key].type
    if isinstance(annotation, str):
        import vllm.config
        from vllm.engine import arg_utils

        namespace = {**vars(vllm.config), **vars(arg_utils)}
        try:
            annotation = eval(annotation, namespace)  # noqa: S307 -- vLLM's own annotation text
        except Exception:  # noqa: BLE001
            return None
    for config in (None, pydantic.ConfigDict(arbitrary_types_allowed=True)):
        try:
            return pydantic.TypeAdapter(annotation, config=config)
        except Exception:  # noqa: BLE001 -- pydantic.PydanticSchemaGenerationError, or config refused
            continue
    return None
