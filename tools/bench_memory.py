"""A shard owner's peak memory as its shard grows: one shard of 10K, 100K and 1M short rows, each
owned in a fresh process, with the engine left out by construction.

    python tools/bench_memory.py [--rows 10000,100000,1000000] [--checkpoint-rows 1000] [--work DIR]

What runs: ``pipeline.roles.work.own_shards``, the code a prefill or colocated worker runs
for its shards (streaming read, prompt rendering with the bundled model's real tokenizer, row
checkpoints, request metrics, the incremental output writer), with a serve function that answers
every row at once with a 1-token generation instead of a vLLM engine: vLLM's engine core runs in
a child process of its own, so this measures what the owner process itself holds. Per size:
peak RSS (``ru_maxrss``) before owning the shard (imports and tokenizer loaded) and after, and
rows/s. ``--checkpoint-rows``: ``job.checkpoint_rows`` (the default 4 writes a checkpoint part
every 4 rows; large shards want more). Prints a Markdown table and the ratio of the largest
shard's peak to the smallest's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import csv_list, parser  # noqa: E402
from tools.benchlib.machine import machine_text  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

WORDS = ("river", "tea", "library", "bridge", "note", "engine", "summary", "garden", "harbour", "train")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def write_shard(path: Path, rows: int) -> None:
    """``rows`` short rows (6-9 words) with string ids, written in row groups of 64K rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("text", pa.string())])) as w:
        for start in range(0, rows, 65536):
            n = min(65536, rows - start)
            w.write_table(pa.table({
                "id": [f"r{i}" for i in range(start, start + n)],
                "text": [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(6 + i % 4)) for i in range(start, start + n)],
            }))


def own_one(work: Path, rows: int, checkpoint_rows: int) -> dict:
    """Own one shard of ``rows`` rows in this process; the figures of :func:`main`'s table."""
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer
    from pipeline.io.output import served_row
    from pipeline.io.shards import list_shards
    from pipeline.roles.work import own_shards
    from pipeline.runtime.claims import Claims
    from pipeline.runtime.rundir import RunDir

    shard_dir = work / f"input-{rows}"
    if not (shard_dir / "shard.parquet").exists():
        write_shard(shard_dir / "shard.parquet", rows)
    run_dir = work / f"run-{rows}-{time.time_ns()}"
    cfg = compose(["+job=summarize", f"job.input={shard_dir}", f"run.dir={run_dir}",
                   f"job.checkpoint_rows={checkpoint_rows}", "job.sampling.max_new_tokens=1"])
    shards = list_shards(str(shard_dir))
    run = RunDir(run_dir)
    run.create(cfg, shards, str(run_dir / "output"), rows)
    tokenizer = load_tokenizer(cfg)

    async def serve(p):  # stands in for the engine: one token, at once
        now = time.time()
        return served_row(text="x", token_ids=[87], finish_reason="length", error=None, token_times=[now],
                          prefill_start=now, prefill_end=None, prefill_worker="bench-0")

    before = _peak_mib()
    t0 = time.perf_counter()
    asyncio.run(own_shards(run, cfg, Claims(run.path, "bench-0"), "bench-0", tokenizer, serve))
    wall = time.perf_counter() - t0
    done = run.done()
    assert done[shards[0].name]["rows"] == rows, done
    return {"rows": rows, "peak_before_mib": round(before, 1), "peak_mib": round(_peak_mib(), 1),
            "rows_per_s": round(rows / wall, 1), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--rows", default="10000,100000,1000000", help="shard sizes, comma-separated")
    ap.add_argument("--checkpoint-rows", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pd-bench-memory"))
    ap.add_argument("--_one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._one:
        print(json.dumps(own_one(a.work, a._one, a.checkpoint_rows)))
        return 0
    results = []
    for rows in (int(r) for r in csv_list(a.rows)):
        # A fresh process per size: ru_maxrss is a process's peak, and it never goes down.
        out = subprocess.run([sys.executable, __file__, "--_one", str(rows), "--work", str(a.work),
                              "--checkpoint-rows", str(a.checkpoint_rows)], capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(results[-1], file=sys.stderr)
    print(machine_text() + "\n")
    print(md_table(["rows in the shard", "peak RSS before owning (MiB)", "peak RSS (MiB)", "rows/s", "wall (s)"],
                   [[r["rows"], r["peak_before_mib"], r["peak_mib"], r["rows_per_s"], r["wall_s"]] for r in results],
                   align="rrrrr"))
    print(f"\npeak RSS, largest shard / smallest: {results[-1]['peak_mib'] / results[0]['peak_mib']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
