"""``python -m pipeline +job=NAME [key=value ...] [--dry-run]``: run a job with Hydra overrides.

``--dry-run`` (the same as ``run.dry_run=true``) runs every check made at start
(:mod:`pipeline.preflight`), prints what would run and exits 0 without starting anything."""

from __future__ import annotations

import signal
import sys

from pipeline.config import ConfigError, compose
from pipeline.launch.watch import RunFailed


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done (or a dry run checked), 1 a worker or shard failed, 2 bad
    configuration or input (one line ``error: ...``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--dry-run" in argv:
        argv = [a for a in argv if a != "--dry-run"] + ["run.dry_run=true"]
    # A SIGTERM (scheduler, `timeout`, `kill`) takes the same path as Ctrl-C, which cancels the
    # workers; otherwise they would outlive the launcher.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cfg = compose(argv)
        from pipeline.run import start_job

        handle = start_job(cfg)
        if cfg.run.dry_run:
            print(handle.plan.describe())
            return 0
        wait = cfg.run.wait if cfg.run.wait is not None else cfg.cluster.launcher == "local"
        if handle.nothing_to_do:
            print(f"nothing to do: all {handle.n_shards} shards are already done in {handle.run_dir}")
            return 0
        if not wait:
            print(f"submitted jobs {', '.join(handle.job_ids)}\nrun dir: {handle.run_dir}\n"
                  f"follow: {sys.executable} -m pipeline.status {handle.run_dir}")
            return 0
        summary = handle.wait(progress=cfg.run.progress)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"error: run failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(summary.text())
    return 0 if summary.shards_done == summary.shards else 1


if __name__ == "__main__":
    sys.exit(main())
