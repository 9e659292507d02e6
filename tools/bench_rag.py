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

import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.io.metrics import read_worker_metrics  # noqa: E402
from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.procs import run_pipeline  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

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
    run_pipeline(["+job=rag", "pools=disaggregated", "pools.decode=2", f"job.input={input_path}",
                  f"job.rag.prefix_routing={str(routing).lower()}", f"job.sampling.max_new_tokens={max_new_tokens}",
                  "run.progress=false", f"run.dir={run_dir}", f"job.output={run_dir / 'out'}"], "run")
    w = read_worker_metrics(run_dir).to_pylist()
    out: dict = {"routing": routing, "wall_s": time.monotonic() - t0}
    for role in ("prefill", "decode"):
        q = sum(s["prefix_cache_queries"] for s in w if s["role"] == role)
        h = sum(s["prefix_cache_hits"] for s in w if s["role"] == role)
        out[f"{role}_queries_tokens"], out[f"{role}_hits_tokens"] = q, h
        out[f"{role}_hit_rate"] = h / q if q else None
    return out


def table(results: list[dict]) -> str:
    """One row per routing setting."""
    return md_table(["prefix routing", "decode prefix-cache hit rate", "decode hits / lookups (tokens)",
                     "prefill hit rate", "wall s"],
                    [["on" if r["routing"] else "off", f"{r['decode_hit_rate']:.3f}",
                      f"{r['decode_hits_tokens']} / {r['decode_queries_tokens']}", f"{r['prefill_hit_rate']:.3f}",
                      f"{r['wall_s']:.0f}"] for r in results])


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--variants", type=int, default=3, choices=range(1, len(PHRASINGS) + 1))
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        n = workload(base / "questions.parquet", a.variants)
        results = [run(base, r, base / "questions.parquet", a.max_new_tokens) for r in (False, True)]
    print(f"{n} questions ({a.variants} phrasings each), 1 prefill + 2 decode workers\n")
    print(table(results))
    if a.json:
        write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
