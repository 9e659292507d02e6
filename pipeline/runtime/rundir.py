"""The run directory: the one place (on a shared file system) where a run's workers meet.

Layout::

    RUN_DIR/config.yaml            resolved config of the run
    RUN_DIR/secret                 the control channel's shared secret (mode 0600)
    RUN_DIR/shards.json            the input shards and the output directory
    RUN_DIR/decode/rank-N.json     a decode worker's control endpoint, written when it is ready
    RUN_DIR/done/SHARD.json        per-shard totals, written after the output shard is in place
    RUN_DIR/failed/SHARD.json      why a shard failed as a whole (unreadable or unwritable)
    RUN_DIR/progress/WORKER.json   rows and output tokens done so far, rewritten as rows finish
    RUN_DIR/stop                   written by the launcher once every prefill task has ended
    RUN_DIR/logs/                  submitit's per-worker logs
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.config import Config, from_yaml, to_yaml
from pipeline.io.atomic import write_json
from pipeline.io.shards import Shard
from pipeline.runtime.secret import create_secret, read_secret


def result_config_changes(old: Config, new: Config) -> list[str]:
    """Keys whose change alters generations (model, prompt, sampling, columns), as dotted names."""
    keys = ["model.path", "model.source", "model.name", "model.dtype", "model.max_model_len",
            "job.prompt_template", "job.system_prompt", "job.text_column", "job.id_column",
            "job.sampling.temperature", "job.sampling.top_p", "job.sampling.max_new_tokens",
            "job.sampling.seed", "job.output"]

    def get(cfg: Config, key: str):
        obj = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj

    return [k for k in keys if get(old, k) != get(new, k)]


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()

    # -- written once by the launcher ---------------------------------------------------------
    def create(self, cfg: Config, shards: list[Shard], output_dir: str, rows: int | None = None) -> None:
        """Lay out the run directory, or reuse one from an earlier run of the same job: done
        shards and row checkpoints stay; what belonged to the earlier launch (decode endpoints,
        progress, failed marks, the stop request) goes.

        Raises:
            ValueError: the directory holds results of a config that gives different outputs.
        """
        if (self.path / "config.yaml").exists() and self.done():
            changed = result_config_changes(self.config(), cfg)
            if changed:
                raise ValueError(f"run.dir {self.path} holds outputs of another config "
                                 f"(changed: {', '.join(changed)}); use a new run.dir")
        for sub in ("decode", "progress", "failed"):
            shutil.rmtree(self.path / sub, ignore_errors=True)
        (self.path / "stop").unlink(missing_ok=True)
        for sub in ("decode", "done", "failed", "progress", "logs"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        create_secret(self.path / "secret")
        (self.path / "config.yaml").write_text(to_yaml(cfg))
        write_json(self.path / "shards.json",
                   {"output": output_dir, "rows": rows, "shards": [asdict(s) for s in shards]})

    def secret(self) -> bytes:
        """The run's control-channel secret (``RUN_DIR/secret``, mode 0600)."""
        return read_secret(self.path / "secret")

    def config(self) -> Config:
        return from_yaml(self.path / "config.yaml")

    def shards(self) -> list[Shard]:
        data = json.loads((self.path / "shards.json").read_text())
        return [Shard(**s) for s in data["shards"]]

    def output_dir(self) -> str:
        return json.loads((self.path / "shards.json").read_text())["output"]

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    # -- decode endpoints ---------------------------------------------------------------------
    def publish_decode(self, rank: int, endpoint: str, worker: str,
                       kv_capacity_tokens: int | None = None, dram_capacity_tokens: int | None = None) -> None:
        """Publish (or refresh: the time written is the worker's heartbeat) a decode endpoint.
        ``kv_capacity_tokens``: the tokens its KV cache holds (blocks x block size), which
        prefill workers route by; ``dram_capacity_tokens``: the tokens its DRAM tier holds
        (slots x block size; None without one)."""
        write_json(self.path / "decode" / f"rank-{rank}.json",
                   {"endpoint": endpoint, "worker": worker, "heartbeat": time.time(),
                    "kv_capacity_tokens": kv_capacity_tokens, "dram_capacity_tokens": dram_capacity_tokens})

    def decode_endpoints(self) -> dict[int, dict[str, str]]:
        out = {}
        for p in sorted((self.path / "decode").glob("rank-*.json")):
            out[int(p.stem.split("-")[1])] = json.loads(p.read_text())
        return out

    # -- shard completion -----------------------------------------------------------------------
    def done_path(self, shard: Shard) -> Path:
        return self.path / "done" / f"{shard.name}.json"

    def mark_done(self, shard: Shard, totals: dict[str, Any]) -> None:
        write_json(self.done_path(shard), totals)

    def mark_failed(self, shard: Shard, error: str, worker: str) -> None:
        write_json(self.path / "failed" / f"{shard.name}.json",
                   {"shard": shard.name, "error": error, "worker": worker})

    def failed(self) -> dict[str, dict[str, Any]]:
        """Shards that failed as a whole (unreadable, unwritable), by name; a later success of
        the same shard (a re-run) wins."""
        done = self.done()
        return {p.name[: -len(".json")]: json.loads(p.read_text())
                for p in (self.path / "failed").glob("*.json")
                if p.name[: -len(".json")] not in done}

    def done(self) -> dict[str, dict[str, Any]]:
        return {p.name[: -len(".json")]: json.loads(p.read_text())
                for p in (self.path / "done").glob("*.json")}

    # -- progress and shutdown ------------------------------------------------------------------
    def write_progress(self, worker: str, data: dict[str, Any]) -> None:
        write_json(self.path / "progress" / f"{worker}.json", data)

    def progress(self) -> list[dict[str, Any]]:
        out = []
        for p in (self.path / "progress").glob("*.json"):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def all_settled(self) -> bool:
        """Every shard of the run is done or failed."""
        settled = set(self.done()) | {p.name[: -len(".json")] for p in (self.path / "failed").glob("*.json")}
        return all(s.name in settled for s in self.shards())

    def request_stop(self) -> None:
        (self.path / "stop").touch()

    def stop_requested(self) -> bool:
        return (self.path / "stop").exists()
