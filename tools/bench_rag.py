"""Prefix-aware routing benchmark for the RAG job: the same questions through 1 prefill and 2
decode workers with ``job.rag.prefix_routing`` on and off, in one run of this script.

Workload: every sample question (``data/rag/questions.parquet``) asked in ``--variants`` phrasings
(RAG jobs often ask about the same passages); the variants of a question retrieve the same best
passage, so their prompts share the instructions and passage [1]. With routing on they meet the
same decode worker, whose vLLM prefix cache then holds that prefix; with routing off each goes to
the least-loaded decode worker.

Figures come from vLLM's own per-step scheduler stats (``RUN_DIR/metrics/workers``): prompt
tokens looked up in each engine's local prefix cache and tokens found (hits), per role.

    .venv/bin/python tools/bench_rag.py [--variants 3] [--max-new-tokens 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.metrics import read_worker_metrics  # noqa: E402

PHRASINGS = ["{q}", "Briefly: {q}", "In one sentence, {q}", "Please answer: {q}"]


def workload(path: Path, variants: int) -> int:
    q = pq.read_table(ROOT / "data" / "rag" / "questions.parquet").to_pylist()
    rows = [{"id": f"{r['id']}-v{v}", "question": PHRASINGS[v].format(q=r["question"])}
            for r in q for v in range(variants)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


def run(base: Path, routing: bool, input_path: Path, max_new_tokens: int) -> dict:
    run_dir = base / f"routing-{'on' if routing else 'off'}"
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "+job=rag", "pools=disaggregated", "pools.decode=2",
         f"job.input={input_path}", f"job.rag.prefix_routing={str(routing).lower()}",
         f"job.sampling.max_new_tokens={max_new_tokens}", "run.progress=false",
         f"run.dir={run_dir}", f"job.output={run_dir / 'out'}"],
        cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run failed:\n{p.stderr[-3000:]}")
    w = read_worker_metrics(run_dir).to_pylist()
    out: dict = {"routing": routing, "wall_s": time.monotonic() - t0}
    for role in ("prefill", "decode"):
        q = sum(s["prefix_cache_queries"] for s in w if s["role"] == role)
        h = sum(s["prefix_cache_hits"] for s in w if s["role"] == role)
        out[f"{role}_queries_tokens"], out[f"{role}_hits_tokens"] = q, h
        out[f"{role}_hit_rate"] = h / q if q else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=3, choices=range(1, len(PHRASINGS) + 1))
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        n = workload(base / "questions.parquet", a.variants)
        results = [run(base, r, base / "questions.parquet", a.max_new_tokens) for r in (False, True)]
    print(f"{n} questions ({a.variants} phrasings each), 1 prefill + 2 decode workers\n")
    print("| prefix routing | decode prefix-cache hit rate | decode hits / lookups (tokens) | prefill hit rate | wall s |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {'on' if r['routing'] else 'off'} | {r['decode_hit_rate']:.3f} | {r['decode_hits_tokens']} / "
              f"{r['decode_queries_tokens']} | {r['prefill_hit_rate']:.3f} | {r['wall_s']:.0f} |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
