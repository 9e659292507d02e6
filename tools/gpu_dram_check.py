"""The DRAM-tier long-context check on one CUDA GPU (prepared for a GPU machine; see
BENCHMARKS.md for whether it has been run).

    python tools/gpu_dram_check.py [--work /tmp/pd-gpu-dram] [--rows 8] [--decode-blocks 65]

Needs the CUDA builds of the pinned packages in the active environment (``vllm==0.32.0`` with
its CUDA torch, ``nixl==1.5.1``, and this project: ``pip install -e .``), and the bundled model
(``tools/setup.sh`` fetches it). Both engines share the one GPU
(``model.gpu_memory_utilization=0.3`` each); the KV cache lives in HBM, the DRAM tier in pinned
host memory.

Runs, on long prompts (4,000-7,500 tokens, 8K context): a colocated run, then 1P:1D with
``offload=dram`` and a decode KV cache of ``--decode-blocks`` blocks (one long request at a
time). Checks, and prints as JSON: greedy output equal to colocated row by row; the decode
engine computed one prompt token per request (vLLM's counters); one write per request of its
whole blocks; each write done within its transfer time + 0.1 s of its prefill ending. Exits 1 if
a check fails.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.procs import run_pipeline  # noqa: E402


def run(work: Path, name: str, input_dir: Path, *overrides: str) -> Path:
    run_dir = work / name
    p = run_pipeline(["+job=summarize", "model.dtype=float32", "run.progress=false", "model.max_model_len=8192",
                      "model.gpu_memory_utilization=0.3", "job.sampling.max_new_tokens=128", f"job.input={input_dir}",
                      f"job.output={run_dir / 'out'}", f"run.dir={run_dir / 'run'}", *overrides], name)
    print(p.stdout[-2000:], file=sys.stderr)
    return run_dir


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pd-gpu-dram"))
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--decode-blocks", type=int, default=65)
    args = ap.parse_args()
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer, model_kv_bytes_per_token
    from pipeline.io.metrics import read_request_metrics, read_worker_metrics
    from tools.long_prompts import write_long_prompts

    cfg = compose(["+job=summarize", "model.dtype=float32"])
    input_dir = args.work / "input"
    write_long_prompts(input_dir, load_tokenizer(cfg), args.rows, 1, 4000, 7500)
    coloc = run(args.work, "colocated", input_dir, "pools=colocated")
    dram = run(args.work, "dram", input_dir, "pools=disaggregated", "offload=dram", "offload.dram_gib=8",
               f"model.decode_kv_blocks={args.decode_blocks}")

    shard = "shard-00000.parquet"
    got = pq.read_table(dram / "out" / shard).to_pylist()
    want = pq.read_table(coloc / "out" / shard).to_pylist()
    steps = read_worker_metrics(dram / "run").to_pylist()
    reqs = read_request_metrics(dram / "run").to_pylist()
    prefill = [s for s in steps if s["role"] == "prefill"]
    decode = [s for s in steps if s["role"] == "decode"]
    held = [h for s in prefill for h in (s["kv_held_s"] or ())]
    xfer = [t for s in prefill for t in (s["kv_transfer_s"] or ())]
    moved = sorted(b for s in prefill for b in (s["kv_transfer_bytes"] or ()))
    per_token = model_kv_bytes_per_token(cfg)
    checks = {
        "no_errors": all(r["error"] is None for r in got),
        "output_equals_colocated": [r["generation_token_ids"] for r in got] == [r["generation_token_ids"] for r in want],
        "decode_prompt_tokens_computed": sum(s["prompt_tokens_computed"] for s in decode),
        "decode_computed_one_prompt_token_per_request": sum(s["prompt_tokens_computed"] for s in decode) == len(reqs),
        "one_write_per_request": len(moved) == len(reqs),
        "writes_are_whole_blocks": all(b % per_token == 0 for b in moved),
        "write_done_within_transfer_plus_0.1s": all(h <= t + 0.1 for h, t in zip(held, xfer)),
        "kv_held_s": held, "kv_transfer_s": xfer, "kv_transfer_bytes": moved,
        "decode_max_waiting": max((s["waiting"] or 0) for s in decode),
        "decode_preempted": sum(s["preempted"] for s in decode),
    }
    print(json.dumps(checks, indent=1))
    ok = all(v for k, v in checks.items() if isinstance(v, bool))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
