"""Run a job: create the run directory, launch the workers, wait, and summarise."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.config import Config
from pipeline.data.shards import list_shards
from pipeline.launch.rundir import RunDir, write_json
from pipeline.launch.watch import watch


@dataclass
class Summary:
    """Totals of a finished run. Tokens are counts; ``wall_s`` is seconds from launch to end."""

    run_dir: str
    output: str
    shards: int
    shards_done: int
    rows: int
    errors: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    failed: dict[str, str]  # shard name -> why it failed as a whole

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def text(self) -> str:
        return (f"rows done {self.rows - self.errors}, rows with errors {self.errors} | "
                f"prompt tokens {self.prompt_tokens}, output tokens {self.output_tokens} | "
                f"{self.output_tokens_per_s:.1f} output tok/s | wall {self.wall_s:.1f} s\n"
                f"output: {self.output} ({self.shards_done}/{self.shards} shards)\n"
                f"run dir: {self.run_dir}"
                + "".join(f"\nfailed shard {name}: {why}" for name, why in self.failed.items()))


def new_run_dir(cfg: Config) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir)
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    return Path(cfg.run.root) / cfg.job.name / stamp


def run_job(cfg: Config) -> Summary:
    """Run ``cfg`` to the end and return its :class:`Summary` (also written to
    ``RUN_DIR/summary.json``).

    Raises:
        FileNotFoundError: ``job.input`` holds no Parquet shards.
        pipeline.launch.watch.RunFailed: a worker failed.
    """
    from pipeline.roles.engine import model_path

    shards = list_shards(cfg.job.input)
    run = RunDir(new_run_dir(cfg))
    output = cfg.job.output or str(run.path / "output")
    run.create(cfg, shards, output)
    model_path(cfg)  # convert the bundled model once, before workers start
    t0 = time.monotonic()
    if cfg.cluster.launcher == "local":
        from pipeline.launch.local import launch_local

        jobs = launch_local(cfg, run)
    else:
        raise NotImplementedError(f"cluster.launcher={cfg.cluster.launcher!r} is not available yet")
    total_rows = sum(_num_rows(s.url) for s in shards)
    watch(run, jobs, total_rows, progress=cfg.run.progress)
    done = run.done()
    summary = Summary(
        run_dir=str(run.path), output=output, shards=len(shards), shards_done=len(done),
        rows=sum(d["rows"] for d in done.values()), errors=sum(d["errors"] for d in done.values()),
        prompt_tokens=sum(d["prompt_tokens"] for d in done.values()),
        output_tokens=sum(d["output_tokens"] for d in done.values()),
        wall_s=time.monotonic() - t0,
        failed={name: f["error"] for name, f in run.failed().items()},
    )
    write_json(run.path / "summary.json", {**asdict(summary), "output_tokens_per_s": summary.output_tokens_per_s})
    return summary


def _num_rows(url: str) -> int:
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows
