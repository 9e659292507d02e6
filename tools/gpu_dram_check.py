"""The decode DRAM tier on one CUDA GPU, as one prepared script (issue #18 §3; see BENCHMARKS.md
for whether it has been run on a GPU).

    python tools/gpu_dram_check.py [--work /tmp/pd-gpu-dram] [--rows 6] [--decode-blocks 65] [--dry-run]

Needs the CUDA builds of the pinned packages in the active environment (``vllm==0.32.0`` with
its CUDA torch, ``nixl==1.5.1``, and this project: ``bash tools/setup.sh`` installs them where
``nvidia-smi`` works), and the bundled model. Both engines share the one GPU
(``model.gpu_memory_utilization=0.3`` each); the KV cache lives in HBM, the DRAM tier in pinned
host memory. About 4-6 minutes on an H100/H200 (two engine starts of ~1-2 minutes each).

Prints one line per check (``PASS`` / ``FAIL`` / ``INFO`` / ``SKIP``) and exits 1 if any fails:

1. ``engine start``: a colocated run of long prompts (4,000-7,500 tokens, 8K context) finishes;
2. ``P/D equals colocated``: 1P:1D with ``offload=dram`` and a decode KV cache of
   ``--decode-blocks`` blocks (one long request at a time) gives the same greedy tokens, row by
   row, with no error row;
3. ``decode computed one prompt token per request`` (vLLM's counters), ``one write per request
   of whole blocks``, ``each write done within its transfer time + 0.1 s``;
4. ``DRAM tier pinned``: the decode engine registered the tier with ``cudaHostRegister`` (its
   log line);
5. ``HBM -> DRAM``: the prefill worker's NIXL writes (their telemetry: bytes / transfer time)
   against ``cudaMemcpy`` device-to-host into pinned memory, measured here; ``DRAM -> HBM``:
   the decode engine's load path (:func:`pipeline.engine.dram_pool.copy_blocks`, from a
   ``cudaHostRegister``-pinned shared-memory pool as the engine maps it) against ``cudaMemcpy``
   host-to-device, 256 MiB; each must reach ``--min-ratio`` (0.5) of ``cudaMemcpy``.

``--dry-run`` (any machine; CI runs it): checks that the script starts, writes the input, and
runs step 5's DRAM -> KV-cache copy with the engine's own code on the CPU (a pool in
``/dev/shm``, 16 MiB), checking its bytes and printing its rate beside a plain copy's (not
checked: a CPU run is no measure of the GPU's); every step that needs a GPU or an engine prints
``SKIP``. ``tools/gpu_nixl_check.py`` checks NIXL alone (no vLLM).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import parser  # noqa: E402
from tools.gpu_nixl_check import Checks  # noqa: E402

MIB = 2**20
PINNED_LINE = "pinned with cudaHostRegister"


def run(work: Path, name: str, input_dir: Path, *overrides: str):
    """One pipeline run into ``work/name``: its directory and the finished process."""
    import subprocess

    from tools.benchlib.procs import pipeline_command

    run_dir = work / name
    p = subprocess.run(pipeline_command("+job=summarize", "model.dtype=float32", "run.progress=false", "model.max_model_len=8192",
                      "model.gpu_memory_utilization=0.3", "job.sampling.max_new_tokens=128", f"job.input={input_dir}",
                      f"job.output={run_dir / 'out'}", f"run.dir={run_dir / 'run'}", *overrides),
                       cwd=ROOT, capture_output=True, text=True)
    return run_dir, p


def load_rates(mib: int, gpu: bool, repeats: int = 3) -> tuple[float, float, bool]:
    """Seconds to copy ``mib`` MiB from a shared-memory pool (mapped and, on a GPU, pinned as the
    decode engine maps it) into a KV-cache-like tensor with the engine's own block copy, and with
    one plain ``Tensor.copy_`` of the same bytes (``cudaMemcpy`` host-to-device on a GPU);
    medians of ``repeats``; and whether the engine's copy delivered the pool's bytes unchanged
    (a random pattern, checked after the first copy)."""
    import torch

    from pipeline.engine.dram_pool import BlockRegions, copy_blocks

    block, regions = MIB, 4
    blocks = mib // regions
    path = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)) / "pool.kv"
    size = blocks * regions * block
    with open(path, "wb") as f:
        f.truncate(size)
    try:
        pool = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        pool.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8))
        if gpu:
            err = int(torch.cuda.cudart().cudaHostRegister(pool.data_ptr(), size, 0))
            if err:
                raise RuntimeError(f"cudaHostRegister failed: cudaError {err}")
        kv = torch.zeros(regions, blocks, block, dtype=torch.uint8, device="cuda" if gpu else "cpu")
        src = BlockRegions.pool(pool.data_ptr(), regions * block, regions, blocks, pool)
        dst = BlockRegions([kv[r].data_ptr() for r in range(regions)], block, blocks, views=list(kv.unbind(0)))
        order = list(range(blocks))

        def engine_copy() -> float:
            t0 = time.perf_counter()
            copy_blocks(src, order, dst, order)
            if gpu:
                torch.cuda.synchronize()
            return time.perf_counter() - t0

        def plain_copy() -> float:
            t0 = time.perf_counter()
            kv.view(-1).copy_(pool, non_blocking=gpu)
            if gpu:
                torch.cuda.synchronize()
            return time.perf_counter() - t0
        engine_copy()  # also the warm-up
        same = bool(torch.equal(kv.view(-1).cpu(), pool))
        plain_copy()
        return (statistics.median(engine_copy() for _ in range(repeats)),
                statistics.median(plain_copy() for _ in range(repeats)), same)
    finally:
        path.unlink(missing_ok=True)
        path.parent.rmdir()


def d2h_seconds(nbytes: int, repeats: int = 3) -> float:
    """``cudaMemcpy`` device-to-host into pinned memory: seconds for ``nbytes`` (median)."""
    import torch

    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        host.copy_(dev)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def engine_checks(args, c: Checks, input_dir: Path) -> None:
    """Steps 1-5 with engines (GPU only)."""
    import pyarrow.parquet as pq

    from pipeline.config import compose
    from pipeline.engine.model import model_kv_bytes_per_token
    from pipeline.io.metrics import read_request_metrics, read_worker_metrics

    coloc, p = run(args.work, "colocated", input_dir, "pools=colocated")
    if not c.check(p.returncode == 0, "engine start", f"colocated run exit {p.returncode}; log {coloc / 'run' / 'logs'}"):
        return
    dram, p = run(args.work, "dram", input_dir, "pools=disaggregated", "offload=dram", "offload.dram_gib=8",
                  f"model.decode_kv_blocks={args.decode_blocks}")
    if not c.check(p.returncode == 0, "P/D run", f"exit {p.returncode}; log {dram / 'run' / 'logs'}"):
        return
    shard = "part-00000.parquet"
    got = pq.read_table(dram / "out" / shard).to_pylist()
    want = pq.read_table(coloc / "out" / shard).to_pylist()
    same = sum(g["generation_token_ids"] == w["generation_token_ids"] for g, w in zip(got, want))
    c.check(same == len(want) and all(r["error"] is None for r in got), "P/D equals colocated",
            f"{same}/{len(want)} rows with identical greedy tokens")
    steps = read_worker_metrics(dram / "run").to_pylist()
    reqs = read_request_metrics(dram / "run").to_pylist()
    prefill = [s for s in steps if s["role"] == "prefill"]
    decode = [s for s in steps if s["role"] == "decode"]
    held = [h for s in prefill for h in (s["kv_held_s"] or ())]
    xfer = [t for s in prefill for t in (s["kv_transfer_s"] or ())]
    moved = [b for s in prefill for b in (s["kv_transfer_bytes"] or ())]
    computed = sum(s["prompt_tokens_computed"] for s in decode)
    c.check(computed == len(reqs), "decode computed one prompt token per request", f"{computed} for {len(reqs)}")
    per_token = model_kv_bytes_per_token(compose(["+job=summarize", "model.dtype=float32"]))
    c.check(len(moved) == len(reqs) and all(b % per_token == 0 for b in moved), "one write per request of whole blocks",
            f"{len(moved)} writes for {len(reqs)} requests")
    c.check(all(h <= t + 0.1 for h, t in zip(held, xfer)), "each write done within its transfer time + 0.1 s",
            f"held max {max(held, default=0):.3f} s")
    logs = "".join(f.read_text(errors="replace") for f in (dram / "run" / "logs").rglob("*") if f.is_file())
    c.check(PINNED_LINE in logs, "DRAM tier pinned", "the decode engine's cudaHostRegister log line"
            if PINNED_LINE in logs else f"no '{PINNED_LINE}' in {dram / 'run' / 'logs'}")
    if moved:
        nixl_gbps = statistics.median(b / t / 1e9 for b, t in zip(moved, xfer) if t > 0)
        memcpy_gbps = statistics.median(moved) / d2h_seconds(int(statistics.median(moved))) / 1e9
        c.check(nixl_gbps >= args.min_ratio * memcpy_gbps, "HBM -> DRAM (prefill's NIXL writes)",
                f"{nixl_gbps:.2f} GB/s vs cudaMemcpy D2H {memcpy_gbps:.2f} GB/s (need >= {args.min_ratio:g}x)")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="tools/gpu_dram_check.py")
    ap.add_argument("--work", type=Path, default=Path("/tmp/pd-gpu-dram"))
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--decode-blocks", type=int, default=65)
    ap.add_argument("--min-ratio", type=float, default=0.5)
    ap.add_argument("--dry-run", action="store_true", help="no GPU, no engine: start, input, the CPU copy path")
    args = ap.parse_args(argv)
    c = Checks()
    try:
        import torch

        from pipeline.config import compose
        from pipeline.engine.model import load_tokenizer
        from tools.long_prompts import write_long_prompts

        gpu = not args.dry_run
        if gpu and not c.check(torch.cuda.is_available(), "cuda", torch.version.cuda or "torch without CUDA"):
            return 1
        input_dir = args.work / "input"
        counts = write_long_prompts(input_dir, load_tokenizer(compose(["+job=summarize"])), args.rows, 1, 4000, 7500)
        c.line("PASS", "input", f"{len(counts)} rows of {min(counts)}-{max(counts)} tokens in {input_dir}")
        if gpu:
            engine_checks(args, c, input_dir)
        else:
            for name in ("engine start", "P/D equals colocated", "decode computed one prompt token per request",
                         "DRAM tier pinned", "HBM -> DRAM (prefill's NIXL writes)"):
                c.line("SKIP", name, "dry run: needs a GPU and vLLM's CUDA build")
        mib = 256 if gpu else 16
        engine_s, plain_s, same = load_rates(mib, gpu)
        what = "cudaMemcpy H2D" if gpu else "one plain copy (CPU)"
        rates = f"{mib} MiB: {mib * MIB / engine_s / 1e9:.2f} GB/s vs {what} {mib * MIB / plain_s / 1e9:.2f} GB/s"
        name = f"DRAM -> {'HBM' if gpu else 'KV cache'} (decode's load path)"
        if gpu:
            c.check(same and plain_s / engine_s >= args.min_ratio, name,
                    f"{rates} (need >= {args.min_ratio:g}x){'' if same else '; the bytes differ'}")
        else:  # a dry run checks the copy, not its speed: these cores are shared and noisy
            c.check(same, name, f"bytes {'unchanged' if same else 'DIFFER'}; {rates} (not checked on a CPU)")
    except Exception as exc:  # noqa: BLE001 (a check that cannot run is a failed check)
        c.line("FAIL", "run", f"{type(exc).__name__}: {exc}")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
