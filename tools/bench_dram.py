"""Long prompts with and without the decode DRAM tier (``offload=none`` vs ``offload=dram``),
side by side in one run: 1P:1D on this machine (prefill on core 0, decode on core 1), a decode
KV cache capped at ``--decode-blocks`` blocks so that it holds one long request at a time.

    python tools/bench_dram.py [--rows 8] [--min-tokens 4000] [--max-tokens 7000] \\
        [--max-new-tokens 256] [--decode-blocks 65] [--repeats 1] [--work DIR]

Per configuration (medians over repeats): output tokens/s over the run's wall time (from the
run's summary), TTFT p50, and the prefill worker's **idle time waiting for decode capacity**:
the time its engine had requests waiting and none running (its KV cache full of finished
requests' KV that no decode worker has taken yet; from its per-step metrics), plus, with the DRAM
tier, the time its rows waited for DRAM-tier slots before their prefill (``capacity_wait_s``).
Also: the prefill engine's peak KV cache use, rows handed off more than once, and the tokens
decode generated (more than the output when a hand-off was retried). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.procs import run_pipeline  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402
from tools.benchlib.stats import median_of  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

CONFIGS = {"none": ["offload=none"], "dram": ["offload=dram", "offload.dram_gib=4"]}
MEDIANS = ("tok_s", "summary_tok_s", "ttft_p50_s", "prefill_idle_s", "capacity_wait_s", "prefill_peak_kv",
           "retried_rows", "decode_generated_tokens", "output_tokens")


def prefill_engine(run_dir: Path) -> tuple[float, float]:
    """(seconds the prefill engine had requests waiting but none running -- its KV cache full of
    finished requests' KV that no decode worker has taken yet --, its peak KV cache use 0..1),
    from its per-step metrics."""
    from pipeline.io.metrics import read_worker_metrics

    steps = sorted((r for r in read_worker_metrics(run_dir).to_pylist() if r["role"] == "prefill"),
                   key=lambda r: r["t"])
    idle = sum(cur["t"] - prev["t"] for prev, cur in zip(steps, steps[1:])
               if (prev["waiting"] or 0) > 0 and not prev["running"])
    return idle, max((r["kv_cache_usage"] or 0.0) for r in steps)


def one(work: Path, name: str, args: argparse.Namespace, input_dir: Path, rep: int) -> dict:
    from pipeline.io.metrics import read_request_metrics, read_worker_metrics

    run_dir = work / f"{name}-{rep}"
    t0 = time.time()
    run_pipeline(["+job=summarize", "model.dtype=float32", "run.progress=false", "model.max_model_len=8192",
                  f"model.decode_kv_blocks={args.decode_blocks}", f"job.sampling.max_new_tokens={args.max_new_tokens}",
                  f"job.input={input_dir}", f"job.output={run_dir / 'out'}", f"run.dir={run_dir / 'run'}",
                  *CONFIGS[name]], name)
    summary = json.loads((run_dir / "run" / "summary.json").read_text())
    rows = read_request_metrics(run_dir / "run").to_pylist()
    ttft = statistics.median(r["token_times"][0] - r["prefill_start"] for r in rows if r["token_times"])
    waits = sum(r["capacity_wait_s"] or 0.0 for r in rows)
    out_tokens = sum(r["output_tokens"] for r in rows)
    first = min(r["prefill_start"] for r in rows)
    last = max(r["token_times"][-1] for r in rows if r["token_times"])
    idle, peak_kv = prefill_engine(run_dir / "run")
    decoded = sum(r["generation_tokens"] for r in read_worker_metrics(run_dir / "run").to_pylist() if r["role"] == "decode")
    return {"config": name, "rep": rep, "wall_s": time.time() - t0, "summary_tok_s": summary.get("output_tokens_per_s"),
            "tok_s": out_tokens / (last - first), "ttft_p50_s": ttft,
            "prefill_idle_s": idle + waits, "capacity_wait_s": waits, "prefill_peak_kv": peak_kv,
            "retried_rows": sum(r["tries"] > 1 for r in rows), "decode_generated_tokens": decoded,
            "output_tokens": out_tokens, "errors": summary.get("errors")}


def table(results: list[dict]) -> str:
    """One row per configuration, medians over repeats."""
    rows = []
    for name in CONFIGS:
        rs = [r for r in results if r["config"] == name]
        med = {k: median_of(rs, k) for k in MEDIANS}
        rows.append([name, f"{med['tok_s']:.2f}", f"{med['summary_tok_s']:.2f}", f"{med['ttft_p50_s']:.1f}",
                     f"{med['prefill_idle_s']:.1f}", f"{med['capacity_wait_s']:.1f}", f"{med['prefill_peak_kv']:.2f}",
                     f"{med['retried_rows']:g}", f"{med['decode_generated_tokens']:g} / {med['output_tokens']:g}"])
    return md_table(["offload", "output tok/s (first prefill -> last token)",
                     "output tok/s (run summary, with start-up)", "TTFT p50 s", "prefill idle waiting for decode, s",
                     "of which DRAM-slot waits, s", "prefill peak KV use", "rows retried",
                     "decode generated / output tokens"], rows)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--min-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=7000)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--decode-blocks", type=int, default=65)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pd-bench-dram"))
    args = ap.parse_args()
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer
    from tools.long_prompts import write_long_prompts

    input_dir = args.work / "input"
    write_long_prompts(input_dir, load_tokenizer(compose(["+job=summarize"])), args.rows, 1,
                       args.min_tokens, args.max_tokens)
    results = []
    for rep in range(args.repeats):  # alternate, so that drift in machine speed hits both
        for name in CONFIGS:
            r = one(args.work, name, args, input_dir, rep)
            print(json.dumps(r), flush=True)
            results.append(r)
    write_json(args.work / "results.json", results)
    print("\n" + table(results))


if __name__ == "__main__":
    main()
