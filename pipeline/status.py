"""``python -m pipeline.status RUN_DIR``: where a run stands, from its run directory alone (works
from any node that sees it): shards done / failed / total, rows, rows/s, ETA, each worker."""

from __future__ import annotations

import json
import sys
import time

from pipeline.runtime.rundir import RunDir


def status_text(run: RunDir) -> str:
    shards = run.shards()
    done, failed, workers = run.done(), run.failed(), run.progress()
    meta = json.loads((run.path / "shards.json").read_text())
    total_rows = meta.get("rows")
    rows = sum(w["rows"] for w in workers)
    started = (run.path / "shards.json").stat().st_mtime
    elapsed = max(time.time() - started, 1e-9)
    rate = rows / elapsed
    lines = [f"run dir: {run.path}",
             f"shards: {len(done)} done, {len(failed)} failed, {len(shards)} total"
             + (" (finished)" if run.all_settled() else "")]
    if total_rows:
        eta = (total_rows - rows) / rate if rate > 0 and rows < total_rows else 0.0
        lines.append(f"rows: {rows}/{total_rows} | {rate:.2f} rows/s | ETA {eta:.0f} s")
    else:
        lines.append(f"rows: {rows} | {rate:.2f} rows/s")
    for w in sorted(workers, key=lambda w: w["worker"]):
        lines.append(f"  {w['worker']}: {w['rows']} rows, {w['output_tokens']} output tokens, "
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeline.status RUN_DIR", file=sys.stderr)
        return 2
    run = RunDir(argv[0])
    if not (run.path / "shards.json").exists():
        print(f"error: {run.path} is not a run directory (no shards.json)", file=sys.stderr)
        return 2
    print(status_text(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
