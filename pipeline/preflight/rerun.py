"""Preflight: a re-run into a run directory that holds results must not change them."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from pipeline.config import Config, ConfigError, SamplingConfig
from pipeline.io.atomic import url_to_fs
from pipeline.io.shards import Shard
from pipeline.preflight.locations import location, one_line
from pipeline.runtime.rundir import RunDir

# Settings that change which rows are read or what they produce: a run directory holding results
# refuses a re-run that changes any of them. job.input, job.rag.corpus and the output location are
# compared as locations (a run made when the bundled data lay in the checkout's data/, now a link
# into the package, is the same place), the input's files from RUN_DIR/shards.json.
RESULT_KEYS = (
    "job.text_column", "job.id_column", "job.messages_column", "job.sampling_column", "job.lora_column",
    "job.prompt_template",
    "job.system_prompt", "job.too_long", "job.input_column_prefix",
    *(f"job.sampling.{f.name}" for f in fields(SamplingConfig)),
    "job.rag", "job.rag.corpus", "job.rag.embedding_model", "job.rag.chunk_size", "job.rag.overlap",
    "job.rag.top_k", "job.rag.template",
    "model.path", "model.source", "model.name", "model.dtype", "model.max_model_len", "model.seed",
    "model.engine_kwargs", "model.prefill_engine_kwargs", "model.decode_engine_kwargs", "model.lora",
    "transport.on_recompute",  # fail makes a row that decode recomputed an error row
)
_ABSENT = object()


def _get(cfg: Config, key: str) -> Any:
    """The value of dotted ``key``; a sentinel when the schema has no such key."""
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part, _ABSENT)
        if obj is _ABSENT or obj is None:
            return obj
    return obj


def _same_place(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    try:
        return location(*url_to_fs(a)) == location(*url_to_fs(b))
    except (ImportError, ValueError):
        return a == b


def _has_results(run_dir: Path) -> bool:
    return any(p.is_file() for sub in ("done", "checkpoints") for p in (run_dir / sub).rglob("*"))


def rerun_changes(old: Config, new: Config, old_files: list[str] | None = None, files: list[str] | None = None,
                  old_output: str | None = None, output: str | None = None) -> list[str]:
    """The settings that differ between the config ``old`` of a run directory's results and
    ``new``, among those that change which rows are read or what they produce, as dotted names:
    ``job.input`` and ``job.rag.corpus`` (compared as locations), ``job.input (files)`` (the shard names ``old_files``
    then and ``files`` now), :data:`RESULT_KEYS`, ``job.output`` (the resolved output location
    ``old_output`` then and ``output`` now)."""
    changed = [] if _same_place(old.job.input, new.job.input) else ["job.input"]
    if old_files is not None and files is not None and old_files != files:
        changed.append("job.input (files)")
    both_rag = old.job.rag is not None and new.job.rag is not None
    for key in RESULT_KEYS:
        a, b = _get(old, key), _get(new, key)
        if key == "job.rag":
            differs = (a is None) != (b is None)
        elif key == "job.rag.corpus":
            differs = both_rag and not _same_place(a, b)
        else:
            differs = (both_rag or not key.startswith("job.rag.")) and a != b
        if differs:
            changed.append(key)
    if not _same_place(old_output, output):
        changed.append("job.output")
    return changed


def check_rerun(cfg: Config, run_dir: Path, shards: list[Shard], output: str) -> bool:
    """Whether ``run_dir`` holds results (done markers or row checkpoints) of this same config.

    Raises:
        ConfigError: it holds results of a config that reads other rows or gives other outputs.
    """
    if not (run_dir / "config.yaml").is_file() or not _has_results(run_dir):
        return False
    earlier = RunDir(run_dir)
    try:
        old = earlier.config()
        old_files = [s.name for s in earlier.shards()]
        old_output = earlier.output_dir()
    except Exception as exc:  # noqa: BLE001 -- unreadable bookkeeping is a reason to refuse, in one line
        raise ConfigError(f"run.dir: {run_dir} holds results, but its config.yaml or shards.json cannot be "
                          f"read ({one_line(exc)}); use a new run.dir") from None
    changed = rerun_changes(old, cfg, old_files, [s.name for s in shards], old_output, output)
    if changed:
        raise ConfigError(f"run.dir: {run_dir} holds results of another config (changed: {', '.join(changed)}); "
                          f"use a new run.dir, or the settings it was run with")
    return True
