"""``python -m pipeline +job=NAME [group=option ...] [key=value ...] [flags]`` (the console command
``pd-pipeline`` is the same): a Hydra application, and the package's other commands.

- ``pd-pipeline status|plan|report|prepare-model ...``: the first argument, when it is one of
  :data:`COMMANDS`, runs that command with the rest (``pipeline.status``, ``pipeline.plan``,
  ``pipeline.report``, ``pipeline.model.prepare``); an override never looks like these words;
- a run: compose ``conf/`` with the overrides, check everything (:mod:`pipeline.preflight`), run;
  ``--dry-run`` (the same as ``run.dry_run=true``) checks, prints what would run and starts nothing;
- ``pools.prefill=+N run.dir=DIR``: N more workers join the run going on in DIR and claim its
  remaining work (:func:`pipeline.run.join_job`);
- ``--help``: the config groups and their options, how to override and sweep, the flags;
  ``--hydra-help``: Hydra's own; ``--version``: Hydra's version;
- ``--cfg job|hydra|all`` (``-p PACKAGE`` for one part, ``--resolve``): print the composed config;
- ``--info [all|config|defaults|defaults-tree|plugins|searchpath]``: Hydra's information;
- ``--config-dir DIR`` / ``-cd DIR`` (the same as ``hydra.searchpath=[file://DIR]``): a user
  config directory whose options join the shipped groups (``DIR/job/mine.yaml``: ``+job=mine``);
- ``-m`` / ``--multirun``: a sweep (``key=a,b``, ``range(...)``, ``choice(...)``, ``glob(...)``),
  one run per point, every point checked before the first starts (:func:`pipeline.api.sweep`).

Exit status: 0 done (or checked, or printed), 1 a worker or shard failed, 2 bad configuration or
input (one line ``error: ...``), 130 interrupted; a multirun's is its worst point's.
"""

from __future__ import annotations

import argparse
import signal
import sys

from pipeline.config import (
    ConfigError, compose, groups, has_job, hydra_call, parse_overrides, searchpath_override, split_searchpath,
    to_yaml,
)
from pipeline.launch.watch import RunFailed

_ABSENT = object()  # --package names nothing in the config
INFO_CHOICES = ["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"]
OVERRIDES_HELP = """\
key=value     set a value: job.sampling.temperature=0.7 model.path=DIR_OR_HUB_ID
group=option  pick a config group's option: pools=colocated cluster=slurm
+key=value    add a key (+job=NAME; a key the typed schema lacks is refused: +model.bogus=1)
~key          delete a key (~key=value: only when it holds that value)
Quote a value with spaces, braces, colons or commas for the shell and, inside, for Hydra:
'job.prompt_template="Summarize: {text}"' (braces, colons and commas are Hydra's own syntax)
Sweeps, with -m: key=a,b  key=range(0,10,2)  key=choice(a,b)  group=glob(*)  -- one run per point
of the product, in its own run directory RUN_ROOT/<job>/<timestamp>/<n> (<run.dir>/<n> when
run.dir is set), one after another locally; on Slurm each point submits its jobs and goes on."""
# The package's other commands: the first argument picks one (module whose main(argv) runs it,
# what it does). An override never looks like these words (no "="), so they cannot collide.
COMMANDS = {
    "status": ("pipeline.status", "where a run stands: status RUN_DIR"),
    "plan": ("pipeline.plan.cli", "plan the pools of a job: plan --model M --hardware H ..."),
    "report": ("pipeline.report.cli", "a run's report, or two compared: report RUN_DIR [--compare RUN_B]"),
    "prepare-model": ("pipeline.model.prepare", "convert the bundled default model into the cache"),
}


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are :class:`ConfigError` (one line, exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{message} (see python -m pipeline --help)")


def _parser() -> argparse.ArgumentParser:
    """Hydra's command-line flags (``hydra._internal.utils.get_args_parser``), those this entry
    point serves, plus ``--dry-run``."""
    from hydra import __version__

    p = _Parser(prog="python -m pipeline", add_help=False, allow_abbrev=False)
    p.add_argument("--help", "-h", action="store_true", help="this help: config groups, overrides, flags")
    p.add_argument("--hydra-help", action="store_true", help="Hydra's help")
    p.add_argument("--version", action="version", version=f"Hydra {__version__}", help="Hydra's version")
    p.add_argument("overrides", nargs="*", help="key=value ... (== Overrides == above); +job=NAME is required")
    p.add_argument("--cfg", "-c", choices=["job", "hydra", "all"],
                   help="print the composed config instead of running [job|hydra|all]")
    p.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations (job: always)")
    p.add_argument("--package", "-p", help="with --cfg: print only this part (job.sampling)")
    p.add_argument("--run", "-r", action="store_true", help="run one job (the default)")
    p.add_argument("--multirun", "-m", action="store_true", help="run every point of the sweep in the overrides")
    p.add_argument("--info", "-i", nargs="?", const="all", choices=INFO_CHOICES,
                   help=f"print Hydra's information [{'|'.join(INFO_CHOICES)}]")
    p.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR",
                   help="add a user config directory: DIR/job/mine.yaml is +job=mine (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="check everything, print what would run, start nothing")
    return p


def _parse(argv: list[str]) -> argparse.Namespace:
    """The flags and overrides of ``argv``, flags anywhere; a bare ``--info`` before an override
    means ``--info all``."""
    argv = list(argv)
    for i, a in enumerate(argv[:-1]):
        if a in ("--info", "-i") and argv[i + 1] not in INFO_CHOICES:
            argv[i] = "--info=all"
    args = _parser().parse_intermixed_args(argv)
    if args.config_dir:
        # Hydra's --config-dir, as the override it stands for, so that every path that composes
        # (help, --cfg, runs, sweeps, submit) sees the directory the same way.
        args.overrides.insert(0, searchpath_override(args.config_dir))
    if args.dry_run:
        args.overrides.append("run.dry_run=true")
    if args.resolve and not (args.cfg or args.help):
        raise ConfigError("--resolve goes with --cfg or --help")
    if args.run + args.multirun + (args.cfg is not None) + (args.info is not None) > 1:
        raise ConfigError("only one of --run, --multirun, --cfg and --info at a time")
    return args


def _help(args: argparse.Namespace) -> str:
    """``--help``: what the app is, its config groups (options, the one chosen), overrides, the
    flags (in Hydra's format), and the composed config when a job is named."""
    from hydra._internal.hydra import Hydra

    lines = ["pd-pipeline: offline batch LLM inference with disaggregated prefill and decode.", "",
             "usage: pd-pipeline +job=NAME [group=option ...] [key=value ...] [flags]   (or python -m pipeline ...)",
             "       pd-pipeline COMMAND ...   (see == Commands ==)", "",
             "== Configuration groups ==", "Compose the configuration from these groups (group=option):", ""]
    plain = [o.input_line for o in parse_overrides(args.overrides) if not o.is_sweep_override()]
    for group, (options, chosen) in groups(plain).items():
        pick = f"chosen: {chosen}" if chosen else "none chosen: add +job=NAME" if group == "job" else "none chosen"
        lines.append(f"{group}: {', '.join(options)}  ({pick})")
    lines += ["", "== Overrides ==", OVERRIDES_HELP, "", "== Flags ==", Hydra.format_args_help(_parser()), "",
              "== Commands ==", "pd-pipeline COMMAND ... (python -m pipeline COMMAND ...); COMMAND --help for its own:", ""]
    lines += [f"{name:<14}{words}" for name, (_, words) in COMMANDS.items()]
    lines += ["",
              "== Config ==", "Any key of the config can be overridden (job.sampling.max_new_tokens=64)."]
    if has_job(args.overrides):
        lines += ["The config composed with these overrides:", "", to_yaml(compose(args.overrides))]
    else:
        lines.append("Add +job=NAME to see the composed config: python -m pipeline --help +job=summarize")
    return "\n".join(lines).rstrip() + "\n"


def _show_cfg(args: argparse.Namespace) -> str:
    """``--cfg``: ``job`` is the typed, validated config (:func:`pipeline.config.to_yaml`, what
    the run saves as ``RUN_DIR/config.yaml``); ``hydra`` is Hydra's own part, printed by Hydra;
    ``all`` both. ``--package`` (``-p``) prints one part of either."""
    from omegaconf import OmegaConf

    package = None if args.package == "_global_" else args.package
    cfg = compose(args.overrides) if args.cfg != "hydra" or has_job(args.overrides) else None
    if args.cfg == "hydra" or (args.cfg == "all" and (package or "").split(".")[0] == "hydra"):
        dirs, plain = split_searchpath(args.overrides)
        return hydra_call(lambda app: app.show_cfg("config", plain, "hydra", package, args.resolve), dirs)
    if package:
        node = OmegaConf.select(OmegaConf.structured(cfg), package, default=_ABSENT)
        if node is _ABSENT:
            raise ConfigError(f"--package: the config has no {package}")
        if OmegaConf.is_config(node):
            return f"# @package {package}\n{OmegaConf.to_yaml(node)}"
        return f"{'null' if node is None else node}\n"
    text = to_yaml(cfg)
    if args.cfg == "all":
        dirs, plain = split_searchpath(args.overrides)
        text += hydra_call(lambda app: app.show_cfg("config", plain, "hydra", None, args.resolve), dirs)
    return text


def _run(cfg) -> tuple[int, str]:
    """Start one run and report it as a single run always has: the dry run's plan, ``nothing to
    do``, the submitted jobs, or the summary. Returns (exit status, a few words for a sweep's
    summary line)."""
    from pipeline.run import start_job

    try:
        handle = start_job(cfg)
        if cfg.run.dry_run:
            print(handle.plan.describe())
            return 0, "checked (dry run)"
        wait = cfg.run.wait if cfg.run.wait is not None else cfg.cluster.launcher == "local"
        if handle.nothing_to_do:
            print(f"nothing to do: all {handle.n_shards} shards are already done in {handle.run_dir}")
            return 0, "nothing to do"
        if not wait:
            print(f"submitted jobs {', '.join(handle.job_ids)}\nrun dir: {handle.run_dir}\n"
                  f"follow: {sys.executable} -m pipeline.status {handle.run_dir}")
            return 0, f"submitted jobs {', '.join(handle.job_ids)}"
        summary = handle.wait(progress=cfg.run.progress)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, f"error: {exc}"
    except RunFailed as exc:
        print(f"error: run failed: {exc}", file=sys.stderr)
        return 1, f"run failed: {exc}"
    print(summary.text())
    ok = summary.shards_done == summary.shards
    return (0, "ok") if ok else (1, f"{summary.shards - summary.shards_done} of {summary.shards} shards failed")


def _joining(overrides: list[str]) -> tuple[int, list[str]] | None:
    """(N, the other overrides) when the overrides hold ``pools.prefill=+N``: add N workers to a
    running run instead of starting one."""
    import re

    for i, o in enumerate(overrides):
        if m := re.fullmatch(r"pools\.prefill=\+(\d+)", o):
            return int(m.group(1)), overrides[:i] + overrides[i + 1:]
    return None


def _join(workers: int, overrides: list[str]) -> int:
    """``pools.prefill=+N run.dir=DIR``: N more prefill (or colocated) workers for the run in DIR
    (:func:`pipeline.run.join_job`), which claim its remaining work; locally (or with
    ``run.wait=true``) wait for them, then print where the run stands. The run's own config
    (``DIR/config.yaml``) applies; the other overrides only name the run and how to follow it."""
    from pipeline.run import join_job

    cfg = compose(overrides)
    if not cfg.run.dir:
        raise ConfigError(f"pools.prefill=+{workers} adds workers to a running run: name it with run.dir=RUN_DIR")
    try:
        handle = join_job(cfg.run.dir, workers, progress=cfg.run.progress)
        tasks = ", ".join(f"{t} (job {j})" for t, j in zip(handle.joined_tasks, handle.job_ids))
        print(f"joined {handle.run_dir}: array tasks {tasks}", flush=True)
        if not (cfg.run.wait if cfg.run.wait is not None else handle.cfg.cluster.launcher == "local"):
            return 0
        summary = handle.wait(progress=cfg.run.progress)
    except RunFailed as exc:
        print(f"error: a joined worker failed: {exc}", file=sys.stderr)
        return 1
    print(f"joined workers ended; the run so far:\n{summary.text()}")
    return 0


def _multirun(overrides: list[str]) -> int:
    """Check every point of the sweep (:func:`pipeline.api.sweep`: exit 2 in one line before any
    starts), run them one after another, each headed ``== point N: ...``, then one summary line
    a point. Exit status: the worst point's (an interrupt stops the sweep: 130)."""
    from pipeline.api import sweep

    points = sweep(*overrides)
    results: list[tuple[int, str]] = []
    print(f"multirun: {len(points)} points")
    try:
        for p in points:
            print(f"== point {p.index}: {p.label} | run dir {p.cfg.run.dir}", flush=True)
            results.append(_run(p.cfg))
            sys.stdout.flush()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        results.append((130, "interrupted"))
    ok = sum(status == 0 for status, _ in results)
    print(f"== multirun: {len(points)} points, {ok} ok" + (f", {len(points) - len(results)} not started"
                                                            if len(results) < len(points) else ""))
    for p, (status, words) in zip(points, results):
        outcome = words if status == 0 else f"exit {status}: {words}"
        print(f"point {p.index}: {outcome} | {p.label} | run dir {p.cfg.run.dir}")
    return max(status for status, _ in results)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _not_a_command(word: str) -> ConfigError:
    """The error for a first argument that is neither a command nor an override (``stauts``):
    the commands, the nearest, and ``+job=NAME`` when it names a job."""
    import difflib

    from pipeline.config import CONF_DIR

    jobs = sorted(p.stem for p in (CONF_DIR / "job").glob("*.yaml"))
    near = difflib.get_close_matches(word, list(COMMANDS), n=1, cutoff=0.6)
    hint = (f"did you mean +job={word}? " if word in jobs else f"did you mean {near[0]}? " if near else "")
    return ConfigError(f"{word}: not a command ({', '.join(COMMANDS)}) nor an override (key=value); {hint}"
                       f"a run is pd-pipeline +job=NAME [key=value ...] (see --help)")


def _command(name: str, argv: list[str]) -> int:
    """Run the package command ``name`` (a key of :data:`COMMANDS`) with ``argv``; its exit
    status (its ``--help`` exits 0)."""
    import importlib

    return importlib.import_module(COMMANDS[name][0]).main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    """``pd-pipeline`` / ``python -m pipeline``: a first argument in :data:`COMMANDS` runs that
    command with the rest; another word that is not an override (no ``=``) is refused, naming
    the commands; anything else is the Hydra application. Exit status: 0 done (or a dry
    run checked, or help/config/info printed), 1 a worker or shard failed, 2 bad configuration or
    input (one line ``error: ...``), 130 interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return _command(argv[0], argv[1:])
    # A SIGTERM (scheduler, `timeout`, `kill`) takes the same path as Ctrl-C, which cancels the
    # workers; otherwise they would outlive the launcher.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if argv and "=" not in argv[0] and not argv[0].startswith(("-", "+", "~")):
            raise _not_a_command(argv[0])  # an override has "=" (or is ~key): a misspelt command
        args = _parse(argv)
        dirs, plain = split_searchpath(args.overrides)
        if args.help:
            sys.stdout.write(_help(args))
        elif args.hydra_help:
            sys.stdout.write(hydra_call(lambda app: app.hydra_help("config", _parser(), args), dirs))
        elif args.cfg:
            sys.stdout.write(_show_cfg(args))
        elif args.info:
            if has_job(args.overrides):
                compose(args.overrides)  # a bad override is one line here too
            sys.stdout.write(hydra_call(lambda app: app.show_info(args.info, "config", plain), dirs))
        elif args.multirun:
            return _multirun(args.overrides)
        elif (join := _joining(args.overrides)) is not None:
            return _join(*join)
        else:
            return _run(compose(args.overrides))[0]
        return 0
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
