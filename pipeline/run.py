"""Start a job, follow it, and summarise it: the code behind the CLI and ``pipeline.submit``."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.config import Config
from pipeline.io.atomic import write_json
from pipeline.io.units import plan_units
from pipeline.preflight import Plan, preflight
from pipeline.report.text import kv_text, stalls_text
from pipeline.roles.recompute import add_counts
from pipeline.runtime.rundir import RunDir
from pipeline.launch.watch import Jobs, watch


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
    failed: dict[str, str] = field(default_factory=dict)  # shard name -> why it failed as a whole
    # decode rank -> its worker, for each rank lost during the run (its node lost, killed; it
    # may have been requeued later): its rows in flight were served again by the other ranks
    lost_decode: dict[int, str] = field(default_factory=dict)
    report: dict | None = None  # pipeline.report's summary (report.json), when it was written
    # did the KV move: pipeline.roles.recompute.kv_counts over the output rows (summed done markers)
    decode_kv: dict | None = None
    decode_rank_rows: int = 0  # rows decode ranks served on their own, prefill and decode (pools.elastic)
    prefill_local_rows: int = 0  # rows prefill workers served on their own, prefill and decode (pools.elastic)
    # pools=auto: what it chose ("1P:1D", "colocated x2") and that layout's predicted makespan (s)
    planned: dict | None = None

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def text(self) -> str:
        # Every input row is one output row: a generation or an error row (saying why).
        return (f"rows {self.rows}: {self.rows - self.errors} generated, {self.errors} errors | "
                f"prompt tokens {self.prompt_tokens}, output tokens {self.output_tokens} | "
                f"{self.output_tokens_per_s:.1f} output tok/s | wall {self.wall_s:.1f} s\n"
                f"output: {self.output} ({self.shards_done}/{self.shards} shards)\n"
                f"run dir: {self.run_dir}"
                + (f"\nreport: {self.report['report_dir']} | {_latency_line(self.report)}" if self.report else "")
                + (f"\n{kv_text(self.decode_kv)}" if kv_text(self.decode_kv) else "")
                + "".join(f"\n{line}" for line in [self.planned_text()] if line)
                + (f"\npools.elastic: of the {self.rows} rows, decode ranks served {self.decode_rank_rows} on their own and "
                   f"prefill workers {self.prefill_local_rows} (prefill and decode in one engine, no hand-off); "
                   f"the other {self.rows - self.decode_rank_rows - self.prefill_local_rows} went through prefill "
                   f"workers (handed off, or error rows)" if self.decode_rank_rows or self.prefill_local_rows else "")
                + "".join(f"\nfailed shard {name}: {why}" for name, why in self.failed.items())
                + "".join(f"\ndecode rank {rank} ({worker}) was lost during the run; the other decode ranks "
                          f"served its rows" for rank, worker in self.lost_decode.items()))


    def planned_text(self) -> str:
        """pools=auto's predicted makespan against the measured one: the report's ``wall_s``
        (first row read to last token, as the planner's makespan: engine start-ups are not in
        it), or with no report the launch to end; '' when pools=auto did not choose."""
        pred = (self.planned or {}).get("predicted_makespan_s")
        if not pred:
            return ""
        measured, what = ((self.report["wall_s"], "first row read to last token") if self.report
                          else (self.wall_s, "launch to end, engine start-ups included"))
        elastic = "; pools.elastic: the split was a starting point" if self.planned.get("elastic") else ""
        return (f"pools=auto chose {self.planned['choice']}: predicted makespan {pred:.0f} s, measured "
                f"{measured:.0f} s ({what}), {measured / pred:.2f}x the prediction{elastic}")


def planned(run: RunDir) -> dict | None:
    """``RUN_DIR/pools.json`` (pools=auto's choice) as :attr:`Summary.planned`: ``choice``,
    ``predicted_makespan_s`` (the chosen layout's, seconds; null when the planner gave none) and
    ``elastic``; None without the file."""
    try:
        c = json.loads((run.path / "pools.json").read_text())
    except (OSError, ValueError):
        return None
    mode = c.get("mode")
    choice = (f"{c['prefill']}P:{c['decode']}D" + (f", local < {c['local_prefill_tokens']}"
                                                    if c.get("local_prefill_tokens") else "")
              if mode == "disaggregated" else f"colocated x{c['prefill']}")
    return {"choice": choice, "predicted_makespan_s": (c.get("options", {}).get(mode) or {}).get("makespan_s"),
            "elastic": bool(run.config().pools.elastic)}


def _latency_line(r: dict) -> str:
    def ms(key: str) -> str:
        return "-" if r.get(key) is None else f"{1000 * r[key]:.0f} ms"
    return (f"TTFT p50 {ms('ttft_p50_s')}, p99 {ms('ttft_p99_s')} | ITL p50 {ms('itl_p50_s')}, "
            f"p99 {ms('itl_p99_s')}, max {ms('itl_max_s')} | {stalls_text(r, 'run.stall_ms')}")


class RunHandle:
    """A launched run. ``status()`` reads the run directory (cheap, any time); ``wait()`` follows
    the run to its end; ``result()`` opens the output shards as a pyarrow dataset; ``cancel()``
    stops it, keeping what was written. ``plan``: what
    the preflight checked (:class:`pipeline.preflight.Plan`); with ``run.dry_run`` nothing was
    launched and the run directory was not created (``plan.describe()`` says what would run)."""

    def __init__(self, cfg: Config, run: RunDir, jobs: Jobs, output: str, n_shards: int, total_rows: int,
                 plan: Plan | None = None):
        self.cfg, self.run, self.jobs, self.output = cfg, run, jobs, output
        self.n_shards, self.total_rows, self.plan = n_shards, total_rows, plan
        self.started = time.monotonic()
        self._summary: Summary | None = None
        self.joined = False  # these jobs joined a run another launch follows (join_job)
        self.joined_tasks: list[int] = []  # their array task indices
        self.cancelled = False  # cancel() was called

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def nothing_to_do(self) -> bool:
        """Every shard was already done when the run started: no job was launched."""
        return not self.jobs.all()

    @property
    def job_ids(self) -> list[str]:
        return [j.job_id for j in self.jobs.all()]

    def status(self) -> dict:
        """Shards done / failed / total, rows finished, and each job's scheduler state."""
        done, failed = self.run.done(), self.run.failed()
        return {"shards": self.n_shards, "shards_done": len(done), "shards_failed": len(failed),
                "rows": self.total_rows, "rows_done": sum(p["rows"] for p in self.run.progress()),
                "jobs": {j.job_id: j.state for j in self.jobs.all()},
                "finished": all(j.done() for j in self.jobs.array_tasks)}

    def wait(self, progress: bool = False) -> Summary:
        """Follow the run to its end and return its :class:`Summary` (also written to
        ``RUN_DIR/summary.json``); the output folder's card (:mod:`pipeline.report.card`) is
        written or brought up to date.

        Raises:
            pipeline.launch.watch.RunFailed: a worker failed.
        """
        if self._summary is None and self.cancelled:
            # Nothing left to follow: the summary of what was done before cancel().
            self._summary = summarize(self.run, self.output, self.n_shards, time.monotonic() - self.started,
                                      final=not self.joined)
        if self._summary is None:
            watch(self.run, self.jobs, self.total_rows, progress=progress, joined=self.joined)
            self._summary = summarize(self.run, self.output, self.n_shards, time.monotonic() - self.started,
                                      final=not self.joined)
            if not self.joined:
                _card(self.cfg, self.run, self.output, self._summary.wall_s)
            if self.cfg.run.report and not self.joined:
                self._summary.report = _report(self.run)
        return self._summary

    def cancel(self, grace_s: float = 10.0) -> None:
        """Stop the run now: every job of this handle is cancelled (Slurm: ``scancel`` through
        submitit; locally each worker is interrupted, which shuts its engine down, and whatever
        still runs after ``grace_s`` seconds is killed) and the run's decode workers are asked
        to stop. Returns once the local processes are gone (Slurm: once ``scancel`` was sent).

        Nothing written is lost: finished shards and checkpointed rows stay, and running the
        job again with ``run.dir=RUN_DIR`` resumes it. A later :meth:`wait` returns the summary
        of what was done without following the jobs. A handle of joined workers
        (:func:`join_job`) cancels only its own tasks and leaves the run going."""
        from pipeline.launch.watch import cancel_job

        for job in (self.jobs.array_tasks if self.joined else self.jobs.all()):
            cancel_job(job, grace_s)
        if not self.joined:
            self.run.request_stop()
        self.cancelled = True

    def result(self):
        """The output shards as one ``pyarrow.dataset.Dataset`` (waits for the run first): every
        shard's rows, under the union of the shards' schemas (:func:`pipeline.io.shards.read_output`)."""
        from pipeline.io.shards import read_output

        self.wait()
        return read_output(self.output)


def start_job(cfg: Config) -> RunHandle:
    """Check ``cfg`` (:func:`pipeline.preflight.preflight`), resolve ``pools=auto``
    (:mod:`pipeline.plan.auto`: printed, and saved as ``RUN_DIR/pools.json``), then create the
    run directory and launch the workers; returns without waiting. With ``run.dry_run`` only the checks run: the
    handle launched nothing (its ``plan`` says what would run).

    Raises:
        pipeline.config.ConfigError: a check failed (one line naming the setting); nothing was
            created or started.
    """
    from pipeline.engine.model import model_path
    from pipeline.model.resolve import absolute_folder

    cfg.model.path = absolute_folder(cfg.model.path)
    plan = preflight(cfg)
    if not cfg.run.dry_run:
        for line in plan.warnings:
            print(line, file=sys.stderr)
    shards, output, total_rows = plan.shards, plan.output, plan.total_rows
    run = RunDir(plan.run_dir)
    choice = None
    if cfg.pools.mode == "auto":
        cfg, choice = _choose_pools(cfg, plan)
    if cfg.run.dry_run:
        if cfg.cluster.launcher == "slurm":
            from pipeline.launch.slurm import sbatch_preview

            plan.jobs = sbatch_preview(cfg, run, len(plan_units(shards, plan.rows, cfg.job.unit_rows)))
        return RunHandle(cfg, run, Jobs(), output, len(shards), total_rows, plan)
    run.create(cfg, shards, output, total_rows, plan.sample_lists, plan_units(shards, plan.rows, cfg.job.unit_rows))
    if choice is not None:
        write_json(run.path / "pools.json", asdict(choice))
    done = run.done()
    if all(s.name in done for s in shards):
        # Re-running a finished job launches nothing.
        return RunHandle(cfg, run, Jobs(), output, len(shards), total_rows, plan)
    model_path(cfg)  # convert the bundled model once, before workers start
    if cfg.cluster.launcher == "local":
        from pipeline.launch.local import launch_local

        jobs = launch_local(cfg, run)
    else:
        from pipeline.launch.slurm import launch_slurm

        jobs = launch_slurm(cfg, run, len(run.units()))
    jobs.save(run.path / "jobs.json")
    return RunHandle(cfg, run, jobs, output, len(shards), total_rows, plan)


def join_job(run_dir: str | Path, workers: int, progress: bool = False) -> RunHandle:
    """Add ``workers`` prefill (or colocated) workers to the running run at ``run_dir``: array
    tasks numbered after every earlier task (:func:`_new_task_indices`), started with the run's
    own config, locally or on Slurm as the run was; each claims units as any worker does
    (:mod:`pipeline.runtime.claims`). ``RUN_DIR/joined/task-N.json`` names each one's job.
    The run's own launch waits for them before it stops the decode workers; the returned
    handle's ``wait()`` follows only the joined tasks and writes no ``summary.json``.

    Raises:
        pipeline.config.ConfigError: ``run_dir`` is not a run directory, ``workers`` < 1, or the
            run has ended (its launch asked its decode workers to stop: run the job again with
            ``run.dir`` to resume it instead).
    """
    from pipeline.config import ConfigError

    run = RunDir(run_dir)
    if workers < 1:
        raise ConfigError(f"joining {run.path}: workers must be >= 1, got {workers}")
    if not (run.path / "shards.json").exists() or not (run.path / "jobs.json").exists():
        raise ConfigError(f"joining {run.path}: not a launched run directory (no shards.json or jobs.json)")
    if run.stop_requested():
        raise ConfigError(f"joining {run.path}: that run has ended; run the job again with "
                          f"run.dir={run.path} to resume it")
    cfg = run.config()
    cfg.run.progress = progress
    shards, output = run.shards(), run.output_dir()
    tasks = _new_task_indices(run, workers)
    if cfg.cluster.launcher == "local":
        from pipeline.launch.local import join_local

        jobs = join_local(cfg, run, tasks)
    else:
        from pipeline.launch.slurm import join_slurm

        jobs = join_slurm(cfg, run, tasks)
    for i, j in zip(tasks, jobs.array_tasks):
        write_json(run.path / "joined" / f"task-{i}.json", {"task": i, "job": j.job_id})
    handle = RunHandle(cfg, run, jobs, output, len(shards), run.total_rows())
    handle.joined, handle.joined_tasks = True, tasks
    return handle


def _new_task_indices(run: RunDir, n: int) -> list[int]:
    """``n`` array task indices no launch of ``run`` has used: after the launch's own tasks,
    each taken by creating ``RUN_DIR/joined/task-N.json`` exclusively (so two joins at once never
    share one)."""
    folder = run.path / "joined"
    folder.mkdir(exist_ok=True)
    i = len(json.loads((run.path / "jobs.json").read_text())["array_tasks"])
    out = []
    while len(out) < n:
        try:
            os.close(os.open(folder / f"task-{i}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            out.append(i)
        except FileExistsError:
            pass
        i += 1
    return out


def _choose_pools(cfg: Config, plan: Plan):
    """``pools=auto``: the config with the planner's pools (:mod:`pipeline.plan.auto`), printed.

    Raises:
        ConfigError: the planner could not choose (one line saying why).
    """
    from pipeline.config import ConfigError
    from pipeline.plan.auto import choose_pools

    try:
        cfg, choice = choose_pools(cfg, plan.shards, plan.total_rows)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"pools=auto: {str(exc).splitlines()[0]}") from None
    print(choice.text(), flush=True)
    return cfg, choice


def _card(cfg: Config, run: RunDir, output: str, wall_s: float) -> None:
    """Write the output's card (:func:`pipeline.report.card.write_card`) for this launch, which
    started ``wall_s`` seconds ago; a card that cannot be written is a warning, not a failed run."""
    from pipeline.engine.model import model_path
    from pipeline.report.card import Launch, write_card

    try:
        folder = model_path(cfg)
    except (OSError, ValueError):
        folder = None
    now = time.time()
    try:
        write_card(cfg, output, folder, Launch(str(run.path), now - wall_s, now))
    except Exception as exc:  # noqa: BLE001 -- pyarrow and fsspec raise many types; the output itself is whole
        print(f"warning: no output card: {type(exc).__name__}: {exc}", file=sys.stderr)


def _report(run: RunDir) -> dict | None:
    """Write the run report (pipeline.report) into ``RUN_DIR/report``; a report that cannot be
    made (no rows served, say) is a warning, not a failed run."""
    from pipeline.report.write import write_report

    try:
        r = write_report(run.path, stall_s=run.config().run.stall_ms / 1e3)
    except (OSError, ValueError) as exc:
        print(f"warning: no run report: {exc}", file=sys.stderr)
        return None
    r["report_dir"] = str(run.path / "report")
    return r


def summarize(run: RunDir, output: str, n_shards: int, wall_s: float, final: bool = True) -> Summary:
    """The run's totals from its done and failed markers. ``final``: the run has ended, so it is
    written as ``RUN_DIR/summary.json`` and a decode rank that never stopped counts as lost
    (False: where it stands, for workers that joined it)."""
    done = run.done()
    summary = Summary(
        run_dir=str(run.path), output=output, shards=n_shards, shards_done=len(done),
        rows=sum(d["rows"] for d in done.values()), errors=sum(d["errors"] for d in done.values()),
        prompt_tokens=sum(d["prompt_tokens"] for d in done.values()),
        output_tokens=sum(d["output_tokens"] for d in done.values()),
        wall_s=wall_s, failed={name: f["error"] for name, f in run.failed().items()},
        lost_decode=run.lost_decode() if final else {},
        decode_kv=functools.reduce(add_counts, (d.get("decode_kv") for d in done.values()), add_counts(None, None)),
        decode_rank_rows=sum(d.get("decode_rank_rows", 0) for d in done.values()),
        prefill_local_rows=sum(d.get("prefill_local_rows", 0) for d in done.values()),
        planned=planned(run),
    )
    if final:
        write_json(run.path / "summary.json", {**asdict(summary), "output_tokens_per_s": summary.output_tokens_per_s})
    return summary
