"""The run directory: the one place (on a shared file system) where a run's workers meet.

Layout::

    RUN_DIR/config.yaml            resolved config of the run
    RUN_DIR/secret                 the control channel's shared secret (mode 0600)
    RUN_DIR/shards.json            the input shards and the output directory
    RUN_DIR/decode/rank-N.json     a decode worker's control endpoint, written when it is ready
    RUN_DIR/decode/lost.json       decode ranks the launcher saw lost mid-run (rank -> worker)
    RUN_DIR/done/SHARD.json        per-shard totals, written after the output shard is in place
    RUN_DIR/failed/SHARD.json      why a shard failed as a whole (unreadable or unwritable)
    RUN_DIR/progress/WORKER.json   rows and output tokens done so far, rewritten as rows finish
    RUN_DIR/engines/WORKER.json    when a worker's engine started and when it was ready
    RUN_DIR/claims/                which worker holds which unit (pipeline.runtime.claims)
    RUN_DIR/joined/task-N.json     an array task added to the running run (pipeline.run.join_job)
    RUN_DIR/parts/SHARD/           the parts of a shard split into row ranges (pipeline.io.units)
    RUN_DIR/stop                   written by the launcher once every prefill task has ended
    RUN_DIR/logs/                  submitit's per-worker logs
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.config import Config, from_yaml, to_yaml
from pipeline.io.atomic import write_json
from pipeline.io.shards import Shard, run_files, shard_path
from pipeline.io.units import Unit
from pipeline.runtime.secret import create_secret, read_secret

log = logging.getLogger(__name__)

_merger: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor): this process's metrics merges, in turn


def _executor() -> ThreadPoolExecutor:
    global _merger
    if _merger is None or _merger[0] != os.getpid():  # a forked child has no thread of its parent's
        _merger = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-merge"))
    return _merger[1]


def _merge_later(run_path: Path, shard: str) -> Future:
    return _executor().submit(_merge, run_path, shard)


def _merge(run_path: Path, shard: str) -> int:
    from pipeline.io.metrics import compact_request_metrics

    try:
        return compact_request_metrics(run_path, shard)
    except Exception as exc:  # OSError, ArrowException ...: the parts stay valid
        log.warning("request metrics of %s left in parts: %s: %s", shard, type(exc).__name__, exc)
        return 0


def wait_for_merges() -> None:
    """Wait until every request metrics merge this process started (:meth:`RunDir.mark_done`)
    has ended."""
    if _merger is not None and _merger[0] == os.getpid():
        _merger[1].submit(lambda: None).result()


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()
        # shards.json parsed, its shards and units, and the file's (mtime, size, inode) then: it is
        # written once per launch, and a worker asks for it once per unit (10^4 shards: 2 MB).
        self._meta: tuple[tuple[int, int, int], dict[str, Any], list[Shard], list[Unit]] | None = None

    def _shards_json(self) -> tuple[dict[str, Any], list[Shard], list[Unit]]:
        """``shards.json`` (its content, shards and units), parsed again only when the file
        changed (it is replaced whole, :func:`~pipeline.io.atomic.write_json`)."""
        path = self.path / "shards.json"
        st = path.stat()
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._meta is None or self._meta[0] != key:
            data = json.loads(path.read_text())
            shards = [Shard(**s) for s in data["shards"]]
            units = ([Unit(**u) for u in data["units"]] if "units" in data
                     else [Unit(s["index"]) for s in data["shards"]])
            self._meta = (key, data, shards, units)
        return self._meta[1], self._meta[2], self._meta[3]

    # -- written once by the launcher ---------------------------------------------------------
    def create(self, cfg: Config, shards: list[Shard], output_dir: str, rows: int | None = None,
               sample_lists: bool | None = None, units: list[Unit] | None = None) -> None:
        """Lay out the run directory, or reuse one from an earlier run of the same job: done
        shards and row checkpoints stay; what belonged to the earlier launch (decode endpoints,
        progress, engines ready, shard claims, joined tasks, failed marks, the stop request) goes. Whether ``cfg`` may reuse it (the same
        settings as the results there) is checked before, by :mod:`pipeline.preflight`. ``units``:
        the work units (:mod:`pipeline.io.units`; None: one per shard); the parts of an earlier
        launch stay only when it cut the shards the same way.
        """
        units = units or [Unit(s.index) for s in shards]
        if (self.path / "shards.json").exists() and self.units() != units:
            shutil.rmtree(self.path / "parts", ignore_errors=True)
        for sub in ("decode", "progress", "failed", "engines", "claims", "joined"):
            shutil.rmtree(self.path / sub, ignore_errors=True)
        (self.path / "stop").unlink(missing_ok=True)
        for sub in ("decode", "done", "failed", "progress", "logs"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        create_secret(self.path / "secret")
        (self.path / "config.yaml").write_text(to_yaml(cfg))
        lists = cfg.job.sampling.n > 1 if sample_lists is None else sample_lists
        write_json(self.path / "shards.json", {"output": output_dir, "rows": rows, "sample_lists": lists,
                                               "shards": [asdict(s) for s in shards],
                                               "units": [asdict(u) for u in units]})
        self._meta = None

    def secret(self) -> bytes:
        """The run's control-channel secret (``RUN_DIR/secret``, mode 0600)."""
        return read_secret(self.path / "secret")

    def config(self) -> Config:
        return from_yaml(self.path / "config.yaml")

    def shards(self) -> list[Shard]:
        return list(self._shards_json()[1])

    def units(self) -> list[Unit]:
        """The run's work units, in order (one per shard for a run directory written before units)."""
        return list(self._shards_json()[2])

    def parts_dir(self, shard: Shard) -> Path:
        """``RUN_DIR/parts/<shard name>/``: a split shard's parts, their marks and checkpoints."""
        return shard_path(self.path / "parts", shard.name)

    def sample_lists(self) -> bool:
        """Whether the run's sample columns are lists (several samples per prompt: ``job.sampling.n``
        > 1, or a request of an OpenAI batch file asks for them), decided at launch."""
        meta = self._shards_json()[0]
        if "sample_lists" in meta:  # not meta.get(..., default): the default parses config.yaml (0.1 s)
            return bool(meta["sample_lists"])
        return self.config().job.sampling.n > 1

    def output_dir(self) -> str:
        return self._shards_json()[0]["output"]

    def total_rows(self) -> int:
        """Input rows of the run, counted at launch (0 when not counted)."""
        return self._shards_json()[0].get("rows") or 0

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    # -- decode endpoints ---------------------------------------------------------------------
    def publish_decode(self, rank: int, endpoint: str, worker: str, kv_capacity_tokens: int | None = None,
                       dram_capacity_tokens: int | None = None, stopped: bool = False, serving: int = 0,
                       decoding: int = 0, kv_tokens_inflight: int = 0) -> None:
        """Publish (or refresh: the time written is the worker's heartbeat) a decode endpoint.
        ``kv_capacity_tokens``: the tokens its KV cache holds (blocks x block size), which
        prefill workers route by; ``dram_capacity_tokens``: the tokens its DRAM tier holds
        (slots x block size; None without one); ``stopped``: its last, written as it stops
        serving (a rank lost with its node never writes it); ``serving``: hand-offs it is
        serving as it writes (requests); ``decoding``: those plus the rows of its own units
        (``pools.elastic``); ``kv_tokens_inflight``: the KV tokens all of them may reach."""
        write_json(self.path / "decode" / f"rank-{rank}.json",
                   {"endpoint": endpoint, "worker": worker, "heartbeat": time.time(),
                    "kv_capacity_tokens": kv_capacity_tokens, "dram_capacity_tokens": dram_capacity_tokens,
                    "stopped": stopped, "serving": serving, "decoding": decoding,
                    "kv_tokens_inflight": kv_tokens_inflight})

    def record_lost_decode(self, lost: dict[int, str]) -> None:
        """``RUN_DIR/decode/lost.json``: decode rank -> worker, each rank the launcher saw lost
        (its heartbeat stood still for ``transport.decode_dead_after_s`` before it stopped)."""
        write_json(self.path / "decode" / "lost.json", {str(r): w for r, w in lost.items()})

    def lost_decode(self) -> dict[int, str]:
        """What :meth:`record_lost_decode` wrote, plus each rank whose endpoint never said it
        stopped (read once the run has ended)."""
        try:
            out = {int(r): w for r, w in json.loads((self.path / "decode" / "lost.json").read_text()).items()}
        except (OSError, ValueError):
            out = {}
        for rank, ep in self.decode_endpoints().items():
            if not ep.get("stopped"):
                out.setdefault(rank, ep["worker"])
        return dict(sorted(out.items()))

    def decode_endpoints(self) -> dict[int, dict[str, str]]:
        out = {}
        for p in run_files(self.path / "decode", "rank-*.json"):
            out[int(p.stem.split("-")[1])] = json.loads(p.read_text())
        return out

    # -- shard completion -----------------------------------------------------------------------
    def done_path(self, shard: Shard) -> Path:
        """``RUN_DIR/done/<shard name>.json`` (the shard's folders kept; see :func:`shard_path`)."""
        return shard_path(self.path / "done", shard.name, ".json")

    def checkpoint_dir(self, shard: Shard) -> Path:
        """``RUN_DIR/checkpoints/<shard name>/``: the shard's row checkpoints."""
        return shard_path(self.path / "checkpoints", shard.name)

    def mark_done(self, shard: Shard, totals: dict[str, Any]) -> Future:
        """Record ``shard`` as done with its ``totals`` (rows, errors, tokens ...), then merge its
        request metrics parts (one per checkpoint batch, every row's written by now) into one file
        (:func:`~pipeline.io.metrics.compact_request_metrics`) in this process's background
        thread, so that the caller's event loop does not wait for it (about 1 ms a part); returns
        the merge's future. Readers read the parts, or the merged file, or both while it runs,
        each row once; a merge that fails, or a process that ends before its merges ran (they
        run before a normal exit), leaves the parts, which readers read as before."""
        write_json(self.done_path(shard), {"shard": shard.name, **totals})
        return _merge_later(self.path, shard.name)

    def failed_path(self, shard: Shard) -> Path:
        """``RUN_DIR/failed/<shard name>.json`` (see :meth:`done_path`)."""
        return shard_path(self.path / "failed", shard.name, ".json")

    def mark_failed(self, shard: Shard, error: str, worker: str) -> None:
        write_json(self.failed_path(shard), {"shard": shard.name, "error": error, "worker": worker})

    def _markers(self, sub: str) -> dict[str, dict[str, Any]]:
        """The markers under ``RUN_DIR/<sub>/`` by the shard name they record."""
        out = {}
        for p in run_files(self.path / sub, "*.json", recursive=True):
            data = json.loads(p.read_text())
            out[data["shard"]] = data
        return out

    def failed(self, done: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """Shards that failed as a whole (unreadable, unwritable), by name; a later success of
        the same shard (a re-run) wins. ``done``: :meth:`done`, when the caller has read it."""
        done = self.done() if done is None else done
        return {name: f for name, f in self._markers("failed").items() if name not in done}

    def done(self) -> dict[str, dict[str, Any]]:
        """Shards done, by name: their totals (rows, errors, tokens ...)."""
        return self._markers("done")

    # -- progress and shutdown ------------------------------------------------------------------
    def write_progress(self, worker: str, data: dict[str, Any]) -> None:
        write_json(self.path / "progress" / f"{worker}.json", data)

    def progress(self) -> list[dict[str, Any]]:
        out = []
        for p in run_files(self.path / "progress", "*.json"):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def mark_engine_ready(self, worker: str, role: str, started_at: float, shape: dict[str, Any] | None = None) -> None:
        """Record that ``worker``'s engine (``role``: prefill, decode or colocated) is ready to
        serve: ``started_at`` (when its start began) and ``ready_at`` (now), seconds since the
        epoch, and its ``shape`` (:func:`pipeline.engine.build.engine_shape`). A requeued worker's
        next engine replaces the record."""
        write_json(self.path / "engines" / f"{worker}.json",
                   {"worker": worker, "role": role, "started_at": started_at, "ready_at": time.time(),
                    **(shape or {})})

    def engines_ready(self) -> dict[str, int]:
        """Engines ready so far, by role."""
        out: dict[str, int] = {}
        for p in run_files(self.path / "engines", "*.json"):
            try:
                role = json.loads(p.read_text())["role"]
            except (OSError, ValueError, KeyError):
                continue
            out[role] = out.get(role, 0) + 1
        return out

    def starting_engines(self, array_tasks: int, decode: int) -> str | None:
        """``starting engines: prefill 0/1, decode 1/1 ready`` while some engine of a run of
        ``array_tasks`` prefill (or colocated) tasks and ``decode`` decode ranks is not ready;
        None once all are. Array tasks beyond the number of work units find nothing to claim, start
        no engine and are not counted."""
        role = "colocated" if self.config().pools.mode == "colocated" else "prefill"
        expected = {role: min(array_tasks, len(self.units())), "decode": decode}
        ready = self.engines_ready()
        if all(ready.get(r, 0) >= n for r, n in expected.items()):
            return None
        return "starting engines: " + ", ".join(f"{r} {min(ready.get(r, 0), n)}/{n}" for r, n in expected.items()
                                                if n) + " ready"

    def all_settled(self) -> bool:
        """Every shard of the run is done or failed."""
        settled = set(self.done()) | set(self._markers("failed"))
        return all(s.name in settled for s in self.shards())

    def request_stop(self) -> None:
        (self.path / "stop").touch()

    def stop_requested(self) -> bool:
        return (self.path / "stop").exists()
