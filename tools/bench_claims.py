"""Skewed input, fixed shard groups against shards claimed at run time (issue #29).

One big shard and several small ones (rows of the bundled sample, repeated), served by two
workers: ``pools=colocated pools.prefill=2`` and, with ``--layouts coloc2,disagg``, also two
prefill tasks and one decode rank. Each layout runs three times per repeat, alternating, over the
same input: with this checkout, workers claiming the next shard as they free up
(``job.unit_rows=null``), and again with the big shard served in parts of ``--unit-rows`` rows
(its row groups are that size); and with the code at ``--fixed-ref`` (default ``f9b9c3a``, the last commit where array task ``t`` of ``n``
owned the shards ``index mod n == t``), checked out into a temporary git worktree and run from
there with the same interpreter::

    .venv/bin/python tools/bench_claims.py [--repeats 2] [--big 24] [--small 5x4] [--layouts coloc2]

Figures, from each run's own records (``RUN_DIR/engines``, ``RUN_DIR/done``):

- **makespan**: from the first engine ready to the last shard done (engine start-up excluded);
- **first finisher idle**: from the moment the first worker to run out of work finished its last
  shard to the end of the makespan, as a share of the makespan (issue #29's target: under 10 %);
- each worker's rows.

Medians over repeats; prints a Markdown table and the machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.machine import machine_text  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

LAYOUTS = {
    "coloc2": ["pools=colocated", "pools.prefill=2", "job.batch_rows=4"],
    "disagg": ["pools=disaggregated", "pools.prefill=2", "pools.decode=1", "job.batch_rows=4"],
}


def skewed_input(folder: Path, big: int, small: list[int], row_group: int | None = None) -> list[int]:
    """Write shard 0 with ``big`` rows (in row groups of ``row_group`` rows; None: one) and one
    shard per entry of ``small``, rows of the bundled sample in turn; returns the shard sizes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [t for f in sorted((ROOT / "data" / "sample").glob("*.parquet"))
             for t in pq.read_table(f).column("text").to_pylist()]
    folder.mkdir(parents=True)
    sizes, n = [big, *small], 0
    for s, rows in enumerate(sizes):
        ids = [f"s{s}r{i}" for i in range(rows)]
        pq.write_table(pa.table({"id": ids, "text": [texts[(n + i) % len(texts)] for i in range(rows)]}),
                       folder / f"part-{s:05d}.parquet", row_group_size=row_group if s == 0 and row_group else None)
        n += rows
    return sizes


def measure(run_dir: Path) -> dict:
    """Makespan, first finisher's idle share and rows per worker, from the run's records."""
    ready = [json.loads(p.read_text())["ready_at"] for p in (run_dir / "engines").glob("*.json")]
    done = [json.loads(p.read_text()) for p in (run_dir / "done").rglob("*.json")]
    last: dict[str, float] = {}
    rows: dict[str, int] = {}
    for d in done:
        for piece in d.get("parts") or [d]:  # a split shard: each part's worker, rows and end
            w = piece["worker"].split("@")[0]
            last[w] = max(last.get(w, 0.0), piece["finished_at"])
            rows[w] = rows.get(w, 0) + piece["rows"]
    start, end = min(ready), max(last.values())
    makespan = end - start
    return {"makespan_s": makespan, "idle_share": (end - min(last.values())) / makespan,
            "rows": dict(sorted(rows.items()))}


def run_once(code: Path, layout: str, inp: Path, run_dir: Path, max_new_tokens: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "pipeline", "+job=summarize", *LAYOUTS[layout], *extra, f"job.input={inp}",
           f"run.dir={run_dir}", f"job.output={run_dir / 'output'}", f"job.sampling.max_new_tokens={max_new_tokens}",
           "run.progress=false"]
    p = subprocess.run(cmd, cwd=code, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{layout} in {code} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return measure(run_dir)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--big", type=int, default=24, help="rows of the big shard")
    ap.add_argument("--small", default="5x4", help="COUNTxROWS: the small shards")
    ap.add_argument("--layouts", default="coloc2", help="comma-separated: coloc2, disagg")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--fixed-ref", default="f9b9c3a", help="commit with fixed shard groups")
    ap.add_argument("--unit-rows", type=int, default=8,
                    help="job.unit_rows of the third variant (claimed, the big shard split), whose row groups are this size")
    args = ap.parse_args(argv)
    count, rows = (int(x) for x in args.small.split("x"))
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as tmp:
        work = Path(tmp)
        sizes = skewed_input(work / "input", args.big, [rows] * count, args.unit_rows)
        fixed = work / "fixed-code"
        subprocess.run(["git", "worktree", "add", "--detach", str(fixed), args.fixed_ref], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            results: dict[tuple[str, str], list[dict]] = {}
            for r in range(args.repeats):
                for layout in args.layouts.split(","):
                    for slug, variant, code, extra in (
                            ("fixed", "fixed groups", fixed, []),
                            ("claimed", "claimed", ROOT, ["job.unit_rows=null"]),
                            ("split", "claimed, big shard split", ROOT, [f"job.unit_rows={args.unit_rows}"])):
                        m = run_once(code, layout, work / "input", work / f"run-{layout}-{slug}-{r}",
                                     args.max_new_tokens, extra)
                        print(f"repeat {r} {layout} {variant}: {m}", file=sys.stderr, flush=True)
                        results.setdefault((layout, variant), []).append(m)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(fixed)], cwd=ROOT, capture_output=True)
    table = []
    for (layout, variant), ms in results.items():
        table.append([layout, variant, f"{statistics.median(m['makespan_s'] for m in ms):.1f}",
                      f"{100 * statistics.median(m['idle_share'] for m in ms):.0f} %",
                      "; ".join(f"{w} {n}" for w, n in ms[-1]["rows"].items())])
    print(f"shards: {sizes} rows; {args.repeats} repeats, medians\n")
    print(md_table(["layout", "shards", "makespan s", "first finisher idle", "rows per worker (last repeat)"], table,
                   "llrrl"))
    print("\n" + machine_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
