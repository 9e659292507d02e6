"""``python -m pipeline +job=NAME [key=value ...]``: run a job with Hydra overrides."""

from __future__ import annotations

import signal
import sys

from pipeline.config import ConfigError, compose
from pipeline.launch.watch import RunFailed


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 a worker or shard failed, 2 bad configuration or input."""
    argv = sys.argv[1:] if argv is None else argv
    # A SIGTERM (scheduler, `timeout`, `kill`) takes the same path as Ctrl-C, which cancels the
    # workers; otherwise they would outlive the launcher.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cfg = compose(argv)
        from pipeline.run import start_job

        handle = start_job(cfg)
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
