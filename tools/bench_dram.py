"""Long prompts with and without the decode DRAM tier (``offload=none`` vs ``offload=dram``),
side by side in one run: 1P:1D on this machine (prefill on core 0, decode on core 1), a decode
KV cache capped at ``--decode-blocks`` blocks so that it holds one long request at a time.

    python tools/bench_dram.py [--rows 8] [--min-tokens 4000] [--max-tokens 7000] \\
        [--max-new-tokens 256] [--decode-blocks 65] [--repeats 1] [--work DIR]
    python tools/bench_dram.py --long [--counts 24576,600,28672,900,32000,700] [--repeats 1]

``--long`` (issue #18): SmolLM2-135M at a 32K context through vLLM's ``hf_overrides`` (YaRN,
factor 4 over its 8,192 positions; :func:`tools.long_prompts.yarn_context`), a batch of 24-32K-token requests mixed
with short ones (``--counts``, document tokens per row), 128 new tokens, each engine's KV cache
2 GiB (364 blocks of 128 tokens in float32), the decode cache capped at ``--decode-blocks``
(default 300 there: one 32K request, never two 24K ones), a DRAM tier of 6 GiB.

Per configuration (medians over repeats): output tokens/s over the run's wall time (from the
run's summary), TTFT p50, and the prefill worker's **idle time waiting for decode capacity**:
the time its engine had requests waiting and none running (its KV cache full of finished
requests' KV that no decode worker has taken yet; from its per-step metrics), plus, with the DRAM
tier, the time its rows waited for DRAM-tier slots before their prefill (``capacity_wait_s``).
Also: the prefill engine's peak KV cache use, rows handed off more than once, and the tokens
decode generated (more than the output when a hand-off was retried), the prompt tokens the
decode engine computed itself (vLLM's counters: one per request when its KV came from the tier),
the DRAM tier's peak use (``RUN_DIR/metrics/dram/``), and per request of ``--detail-tokens`` or
more its KV transfer: bytes, seconds, and how long the prefill worker held the KV after its
prefill ended (DRAM tier: until its write completed and until vLLM freed its blocks; without:
until decode's READ of it completed). Prints Markdown tables.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import csv_list, parser  # noqa: E402
from tools.benchlib.procs import run_pipeline  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402
from tools.benchlib.stats import median_of, percentile  # noqa: E402
from tools.benchlib.tables import fmt, md_table  # noqa: E402
from tools.long_prompts import yarn_context  # noqa: E402

CONFIGS = {"none": ["offload=none"], "dram": ["offload=dram", "offload.dram_gib=4"]}
MEDIANS = ("tok_s", "summary_tok_s", "ttft_p50_s", "ttft_p99_s", "prefill_idle_s", "capacity_wait_s", "prefill_peak_kv",
           "retried_rows", "decode_generated_tokens", "output_tokens", "decode_computed_prompt_tokens", "dram_peak_gib")
LONG = [*yarn_context(32768), "model.kv_cache_gib=2"]
LONG_COUNTS = "24576,600,28672,900,32000,700"
GIB = 2**30
BLOCK_TOKENS = 128  # vLLM-CPU's default block size
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M in float32: 46,080 B


def prefill_engine(steps: list[dict]) -> tuple[float, float]:
    """(seconds the prefill engine had requests waiting but none running -- its KV cache full of
    finished requests' KV that no decode worker has taken yet --, its peak KV cache use 0..1),
    from a run's per-step metrics."""
    steps = sorted((r for r in steps if r["role"] == "prefill"), key=lambda r: r["t"])
    idle = sum(cur["t"] - prev["t"] for prev, cur in zip(steps, steps[1:])
               if (prev["waiting"] or 0) > 0 and not prev["running"])
    return idle, max((r["kv_cache_usage"] or 0.0) for r in steps)


def one(work: Path, name: str, args: argparse.Namespace, input_dir: Path, rep: int) -> dict:
    from pipeline.io.metrics import read_dram_use, read_request_metrics, read_worker_metrics

    run_dir = work / f"{name}-{rep}"
    t0 = time.time()
    context = LONG if args.long else ["model.max_model_len=8192"]
    offload = [*CONFIGS[name], "offload.dram_gib=6"] if args.long and name == "dram" else CONFIGS[name]
    run_pipeline(["+job=summarize", "model.dtype=float32", "run.progress=false", *context,
                  f"model.decode_kv_blocks={args.decode_blocks}", f"job.sampling.max_new_tokens={args.max_new_tokens}",
                  f"job.input={input_dir}", f"job.output={run_dir / 'out'}", f"run.dir={run_dir / 'run'}",
                  *offload], name)
    summary = json.loads((run_dir / "run" / "summary.json").read_text())
    rows = read_request_metrics(run_dir / "run").to_pylist()
    ttfts = [r["token_times"][0] - r["prefill_start"] for r in rows if r["token_times"]]
    waits = sum(r["capacity_wait_s"] or 0.0 for r in rows)
    out_tokens = sum(r["output_tokens"] for r in rows)
    first = min(r["prefill_start"] for r in rows)
    last = max(r["token_times"][-1] for r in rows if r["token_times"])
    steps = read_worker_metrics(run_dir / "run").to_pylist()
    idle, peak_kv = prefill_engine(steps)
    decode = [r for r in steps if r["role"] == "decode"]
    dram = read_dram_use(run_dir / "run")
    return {"config": name, "rep": rep, "wall_s": time.time() - t0, "summary_tok_s": summary.get("output_tokens_per_s"),
            "tok_s": out_tokens / (last - first), "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "prefill_idle_s": idle + waits, "capacity_wait_s": waits, "prefill_peak_kv": peak_kv,
            "retried_rows": sum(r["tries"] > 1 for r in rows),
            "decode_generated_tokens": sum(r["generation_tokens"] for r in decode), "output_tokens": out_tokens,
            "decode_computed_prompt_tokens": sum(r["prompt_tokens_computed"] or 0 for r in decode),
            "decode_prompt_tokens": sum(r["prompt_tokens"] for r in decode), "requests": len(rows),
            "dram_peak_gib": sum(d["peak_slots"] * d["slot_bytes"] for d in dram) / GIB if dram else None,
            "transfers": transfers(rows, steps, args.detail_tokens), "errors": summary.get("errors")}


def transfers(rows: list[dict], steps: list[dict], min_tokens: int) -> list[dict]:
    """Per request of ``min_tokens`` or more prompt tokens (its last try), its KV transfer:
    ``bytes``, ``transfer_s`` (NIXL: post to done), and the seconds from its prefill ending to
    the prefill worker no longer needing the KV: ``held_s`` (DRAM tier: the write completed;
    without: the step in which decode's READ of it completed) and ``freed_s`` (DRAM tier: vLLM
    freed its blocks). A request's transfer is found by its size, whole 128-token blocks of
    46,080 B (SmolLM2-135M, float32), so two requests of the same block count are not told apart."""
    per_block = BLOCK_TOKENS * KV_BYTES_PER_TOKEN
    moved: dict[int, list[dict]] = {}  # bytes -> the transfers of that size, in step order
    for s in steps:
        held = s["kv_held_s"] or [None] * len(s["kv_transfer_bytes"] or ())
        for b, t, h in zip(s["kv_transfer_bytes"] or (), s["kv_transfer_s"] or (), held):
            moved.setdefault(b, []).append({"transfer_s": t, "held_s": h, "t": s["t"]})
    freed = sorted(f for s in steps if s["role"] == "prefill" for f in (s["kv_freed_s"] or ()))
    out = []
    for r in sorted(rows, key=lambda r: r["prompt_tokens"]):
        if r["prompt_tokens"] < min_tokens:
            continue
        nbytes = -(-r["prompt_tokens"] // BLOCK_TOKENS) * per_block
        found = moved.get(nbytes, [])
        x = found[-1] if found else {}
        held = x.get("held_s")
        if held is None and x and r["prefill_end"] is not None:  # pull: decode's READ completed in that step
            held = x["t"] - r["prefill_end"]
        out.append({"prompt_tokens": r["prompt_tokens"], "bytes": nbytes if found else None,
                    "transfer_s": x.get("transfer_s"), "held_s": held, "freed_s": None})
    # vLLM frees a request's blocks some steps after its write: the longest holds go with the
    # largest requests only roughly, so freeing times are listed apart, longest last.
    return out + ([{"freed_s": freed}] if freed else [])


def table(results: list[dict]) -> str:
    """One row per configuration, medians over repeats."""
    rows = []
    for name in [n for n in CONFIGS if any(r["config"] == n for r in results)]:
        rs = [r for r in results if r["config"] == name]
        med = {k: median_of(rs, k) for k in MEDIANS}
        rows.append([name, f"{med['tok_s']:.2f}", f"{med['summary_tok_s']:.2f}", f"{med['ttft_p50_s']:.1f}",
                     f"{med['ttft_p99_s']:.1f}", f"{med['prefill_idle_s']:.1f}", f"{med['capacity_wait_s']:.1f}",
                     f"{med['prefill_peak_kv']:.2f}", f"{med['retried_rows']:g}",
                     f"{med['decode_generated_tokens']:g} / {med['output_tokens']:g}",
                     f"{med['decode_computed_prompt_tokens']:g}", fmt(med["dram_peak_gib"], "s")])
    return md_table(["offload", "output tok/s (first prefill -> last token)",
                     "output tok/s (run summary, with start-up)", "TTFT p50 s", "TTFT p99 s",
                     "prefill idle waiting for decode, s", "of which DRAM-slot waits, s", "prefill peak KV use",
                     "rows retried", "decode generated / output tokens", "decode prompt tokens computed",
                     "DRAM tier peak, GiB"], rows)


def transfer_table(results: list[dict]) -> str:
    """Per long request of each configuration's first repeat: its KV transfer and hold."""
    rows = []
    for name in [n for n in CONFIGS if any(r["config"] == n for r in results)]:
        r = next(r for r in results if r["config"] == name)
        for x in r["transfers"]:
            if "prompt_tokens" in x:
                rate = x["bytes"] / x["transfer_s"] / 1e9 if x["bytes"] and x["transfer_s"] else None
                rows.append([name, x["prompt_tokens"], fmt(x["bytes"] and x["bytes"] / 2**20), fmt(x["transfer_s"], "s"),
                             fmt(rate, "s"), fmt(x["held_s"], "s")])
            else:
                rows.append([name, "vLLM freed the prefill blocks after (s)", "", "", "",
                             ", ".join(f"{f:.2f}" for f in x["freed_s"])])
    return md_table(["offload", "prompt tokens", "KV MiB", "transfer s (NIXL)", "GB/s",
                     "prefill end -> KV no longer needed, s"], rows, "lrrrrr")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--min-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=7000)
    ap.add_argument("--max-new-tokens", type=int, help="default 256; 128 with --long")
    ap.add_argument("--decode-blocks", type=int, help="default 65; 300 with --long")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pd-bench-dram"))
    ap.add_argument("--only", default=",".join(CONFIGS), help="configurations to run (default: none,dram)")
    ap.add_argument("--long", action="store_true", help="32K context, 24-32K-token requests among short ones")
    ap.add_argument("--counts", help=f"--long: document tokens per row (default {LONG_COUNTS})")
    ap.add_argument("--detail-tokens", type=int, default=None,
                    help="list the KV transfer of each request of at least this many prompt tokens "
                         "(default: 16,000 with --long, else 4,000)")
    args = ap.parse_args()
    if args.decode_blocks is None:
        args.decode_blocks = 300 if args.long else 65
    if args.max_new_tokens is None:
        args.max_new_tokens = 128 if args.long else 256
    if args.detail_tokens is None:
        args.detail_tokens = 16_000 if args.long else 4_000
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer
    from tools.long_prompts import write_long_prompts, write_prompts

    input_dir = args.work / "input"
    tokenizer = load_tokenizer(compose(["+job=summarize"]))
    if args.long:
        write_prompts(input_dir, tokenizer, [int(c) for c in (args.counts or LONG_COUNTS).split(",")])
    else:
        write_long_prompts(input_dir, tokenizer, args.rows, 1, args.min_tokens, args.max_tokens)
    results = []
    names = [n for n in CONFIGS if n in csv_list(args.only)]
    for rep in range(args.repeats):  # alternate, so that drift in machine speed hits both
        for name in names:
            r = one(args.work, name, args, input_dir, rep)
            print(json.dumps(r), flush=True)
            results.append(r)
    write_json(args.work / "results.json", results)
    print("\n" + table(results) + "\n\n" + transfer_table(results))


if __name__ == "__main__":
    main()
