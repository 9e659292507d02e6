"""``python -m pipeline.status RUN_DIR``: where a run stands, from its run directory alone (works
from any node that sees it): shards done / failed / total, rows, rows/s, ETA, each worker."""

from __future__ import annotations

import argparse
import json
import sys
import time

from pipeline.io.shards import run_files
from pipeline.io.units import part_written
from pipeline.runtime.claims import holders
from pipeline.runtime.rundir import RunDir


def elapsed_s(run: RunDir, done: dict | None = None, failed: dict | None = None) -> float:
    """Seconds the run's rows/s is measured over, from its launch (when ``shards.json`` was
    written): until now while shards are still open; once every shard is done or failed, until
    the run's end, so that the rate of a finished run stays what it was. The end is, first found:
    ``summary.json``'s ``wall_s`` (the launcher's own measure, launch to end) when written by
    this launch; the latest ``finished_at`` of this launch's done markers; the latest failed
    marker. Never below 1e-9 s. ``done``, ``failed``: ``run.done()`` and ``run.failed()`` when
    the caller has read them (each reads every marker).

    Raises:
        FileNotFoundError: ``run`` has no ``shards.json`` (not a run directory).
    """
    start = (run.path / "shards.json").stat().st_mtime
    done = run.done() if done is None else done
    failed = run.failed(done) if failed is None else failed
    settled = set(done) | set(failed)
    end = _end(run, start, done) if all(s.name in settled for s in run.shards()) else None
    return max((time.time() if end is None else end) - start, 1e-9)


def _end(run: RunDir, start: float, done: dict) -> float | None:
    """When the finished run ended (seconds since the epoch), or None when nothing says."""
    summary = run.path / "summary.json"
    try:
        if summary.stat().st_mtime >= start:  # not left from an earlier launch of this run dir
            wall_s = json.loads(summary.read_text()).get("wall_s")
            if wall_s:
                return start + float(wall_s)
    except (OSError, ValueError):
        pass
    # Done markers of an earlier launch (kept when a run dir is reused) end before this one began.
    finished = [d["finished_at"] for d in done.values() if d.get("finished_at", 0) >= start]
    if finished:
        return max(finished)
    failed = [p.stat().st_mtime for p in run_files(run.path / "failed", "*.json", recursive=True)]
    return max(failed) if failed else None


def status_text(run: RunDir) -> str:
    """What ``python -m pipeline.status`` prints: shards done / failed / total, rows, rows/s
    (over :func:`elapsed_s`), ETA, the engines' start-up while some are not ready
    (:meth:`RunDir.starting_engines`), the shards being served and by whom (their claims,
    :mod:`pipeline.runtime.claims`), each worker's progress (a disaggregated one's rows handed off
    and served alone) and each decode worker's heartbeat.

    Raises:
        FileNotFoundError: ``run`` is not a run directory.
    """
    shards = run.shards()
    done = run.done()
    failed, workers = run.failed(done), run.progress()
    meta = json.loads((run.path / "shards.json").read_text())
    total_rows = meta.get("rows")
    rows = sum(w["rows"] for w in workers)
    rate = rows / elapsed_s(run, done, failed)  # each marker read once (2,000 shards: 0.50 s -> 0.11 s)
    settled = set(done) | set(failed)
    finished = all(s.name in settled for s in shards)
    lines = [f"run dir: {run.path}",
             f"shards: {len(done)} done, {len(failed)} failed, {len(shards)} total"
             + (" (finished)" if finished else "")]
    if total_rows:
        eta = (total_rows - rows) / rate if rate > 0 and rows < total_rows and not finished else 0.0
        lines.append(f"rows: {rows}/{total_rows} | {rate:.2f} rows/s | ETA {eta:.0f} s")
    else:
        lines.append(f"rows: {rows} | {rate:.2f} rows/s")
    jobs = _jobs(run)
    starting = None if finished or jobs is None else run.starting_engines(*jobs)
    if starting:
        lines.append(starting)
    held, names = holders(run.path), {s.index: s.name for s in shards}
    serving = [f"{names[u.shard]}{' ' + u.label() if u.split else ''} ({held[i][1].split('@')[0]}"
               f"{', taken over' if held[i][0] else ''})"
               for i, u in enumerate(run.units()) if i in held and names[u.shard] not in settled
               and not (u.split and part_written(run.parts_dir(shards[u.shard]), u))]
    if serving:
        lines.append("serving: " + ", ".join(serving[:8]) + (f" and {len(serving) - 8} more" if len(serving) > 8 else ""))
    for w in sorted(workers, key=lambda w: w["worker"]):
        lines.append(f"  {w['worker']}: {w['rows']} rows{_paths(w)}, {w['output_tokens']} output tokens, "
                     f"{w['shards']} shards")
    now = time.time()
    for rank, d in sorted(run.decode_endpoints().items()):
        age = now - d.get("heartbeat", 0)
        state = "alive" if age < 10 else "silent (ended, or dead)"
        kv = f", KV cache {d['kv_capacity_tokens']} tokens" if d.get("kv_capacity_tokens") else ""
        if d.get("dram_capacity_tokens"):
            kv += f", DRAM tier {d['dram_capacity_tokens']} tokens"
        lines.append(f"  decode rank {rank} {d['worker']}: {state}, last heartbeat {age:.0f} s ago{kv}")
    for name, f in failed.items():
        lines.append(f"  failed {name}: {f['error']}")
    return "\n".join(lines)


def _paths(w: dict) -> str:
    """How a disaggregated worker's rows were served: a prefill worker's handed off to a decode
    rank or served alone (``pools.elastic``), a decode rank's own units' (served alone)."""
    if w["worker"].startswith("decode-"):
        return " (its own units, served alone)"
    if w["worker"].startswith("prefill-") and "alone" in w:  # progress written before: not said
        return f" ({w['handed_off']} handed off, {w['alone']} served alone)"
    return ""


def _jobs(run: RunDir) -> tuple[int, int] | None:
    """(array tasks, decode ranks) of the run's launch, from ``jobs.json``; None before it is
    written."""
    try:
        jobs = json.loads((run.path / "jobs.json").read_text())
    except (OSError, ValueError):
        return None
    return len(jobs.get("array_tasks") or []), len(jobs.get("decode") or [])


def parser() -> argparse.ArgumentParser:
    """The command's argument (also docs/cli.md, ``tools/manual.py``)."""
    what = " ".join(__doc__.split(":", 1)[1].split())
    p = argparse.ArgumentParser(prog="python -m pipeline.status", description=what[0].upper() + what[1:],
                                epilog="The same: pd-pipeline status RUN_DIR.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (run.dir; printed at launch)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.status RUN_DIR``: print :func:`status_text`. Exit status: 0 (also
    for ``--help``), or 2 on bad usage or when RUN_DIR is not a run directory."""
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or bad usage (2), as a status for pd-pipeline status
        return int(exc.code or 0)
    run = RunDir(args.run_dir)
    if not (run.path / "shards.json").exists():
        print(f"error: {run.path} is not a run directory (no shards.json)", file=sys.stderr)
        return 2
    print(status_text(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
