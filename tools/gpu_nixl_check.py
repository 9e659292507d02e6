"""NIXL between GPU memory and host DRAM, without vLLM (issue #18 §3): the moves the decode DRAM
tier makes on a GPU machine, timed against the CUDA copies that bound them.

    python tools/gpu_nixl_check.py [--sizes-mib 256 2048] [--repeats 3] [--dry-run]

Needs torch with CUDA and ``nixl`` (``pip install nixl==1.5.1``), one GPU. Two NIXL agents in
this process (UCX backend, as vLLM's NIXL worker makes them): one owns a GPU buffer (``VRAM``),
the other a pinned host buffer (``DRAM``, ``torch.empty(pin_memory=True)``, i.e.
``cudaHostAlloc``). For each size, timed (median of ``--repeats`` after one warm-up whose bytes
are checked):

- NIXL WRITE HBM -> DRAM and DRAM -> HBM (the agent holding the source posts it);
- ``cudaMemcpy`` each way (``Tensor.copy_`` between the CUDA tensor and the pinned one, then
  ``torch.cuda.synchronize``);
- a pinned-host to pinned-host copy (``Tensor.copy_``, the host's memory bandwidth for the
  same bytes).

Prints one line per check, ``PASS`` / ``FAIL`` / ``INFO`` with the figures, and exits 1 if any
check fails. Checks: CUDA and NIXL present; every transfer's bytes arrive unchanged; NIXL
reaches at least ``--min-ratio`` (0.5) of ``cudaMemcpy``'s GB/s each way for sizes from 256 MiB.

``--dry-run`` (any machine, no GPU needed; CI runs it): the same two agents and the same code
path with host DRAM on both sides and ``--dry-sizes-mib`` (4), so that the script is known to
start, register memory, transfer and check bytes; the CUDA lines print ``SKIP``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import parser  # noqa: E402

MIB = 2**20


class Checks:
    """One printed line per check; ``failed`` when any was a FAIL."""

    def __init__(self):
        self.failed = False

    def line(self, status: str, name: str, detail: str = "") -> None:
        self.failed |= status == "FAIL"
        print(f"{status:4} {name}" + (f": {detail}" if detail else ""), flush=True)

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        self.line("PASS" if ok else "FAIL", name, detail)
        return ok


def _agents(tag: str):
    """Two UCX agents (progress thread polling every 1 ms, as the pipeline's)."""
    from tools.bench_parts.kv.nixl import make_agent

    a, _ = make_agent(f"pd-check-a-{tag}", {"nixl.pthr_delay_us": "1000"})
    b, _ = make_agent(f"pd-check-b-{tag}", {"nixl.pthr_delay_us": "1000"})
    return a, b


def _exchange(a, b) -> None:
    """Each agent learns the other and its registered memory (metadata taken after registering)."""
    a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())


def _nixl_write(a, a_descs, b, b_descs, b_name: str) -> float:
    """Seconds for one WRITE of ``a_descs`` (agent ``a``) into ``b_descs`` (agent ``b``)."""
    from tools.bench_parts.kv.nixl import wait_done

    handle = a.initialize_xfer("WRITE", a_descs, b_descs, b_name, b"pd-check")
    t0 = time.perf_counter()
    wait_done(a, handle)
    dt = time.perf_counter() - t0
    a.release_xfer_handle(handle)
    return dt


def _timed(f, repeats: int) -> float:
    return statistics.median(f() for _ in range(repeats))


def run(sizes_mib: list[int], repeats: int, min_ratio: float, gpu: bool, c: Checks) -> None:
    import torch

    if gpu:
        if not c.check(torch.cuda.is_available(), "cuda", torch.version.cuda or "torch without CUDA"):
            return
        c.line("INFO", "device", torch.cuda.get_device_name(0))
    else:
        c.line("SKIP", "cuda", "dry run: host DRAM on both sides")
    for mib in sizes_mib:
        n = mib * MIB
        dev = torch.empty(n, dtype=torch.uint8, device="cuda" if gpu else "cpu")
        host = torch.empty(n, dtype=torch.uint8, pin_memory=gpu)
        dev.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8).to(dev.device))
        a, b = _agents(str(mib))
        a_reg, b_reg = a.register_memory([dev]), b.register_memory([host])
        _exchange(a, b)
        try:
            _one_size(a, b, dev, host, mib, repeats, min_ratio, gpu, c)
        finally:
            a.deregister_memory(a_reg)
            b.deregister_memory(b_reg)


def _one_size(a, b, dev, host, mib: int, repeats: int, min_ratio: float, gpu: bool, c: Checks) -> None:
    import torch

    n = mib * MIB
    a_descs, b_descs = a.get_xfer_descs([dev]), b.get_xfer_descs([host])
    where = "HBM" if gpu else "DRAM"
    _nixl_write(a, a_descs, b, b_descs, b.name)  # warm-up, checked
    c.check(torch.equal(host, dev.cpu()), f"{mib} MiB {where} -> DRAM bytes", "identical after NIXL WRITE")
    down = _timed(lambda: _nixl_write(a, a_descs, b, b_descs, b.name), repeats)
    host.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8))
    _nixl_write(b, b_descs, a, a_descs, a.name)
    c.check(torch.equal(dev.cpu(), host), f"{mib} MiB DRAM -> {where} bytes", "identical after NIXL WRITE")
    up = _timed(lambda: _nixl_write(b, b_descs, a, a_descs, a.name), repeats)
    other = torch.empty(n, dtype=torch.uint8, pin_memory=gpu)
    host_copy = _timed(lambda: _copy(other, host, gpu), repeats)
    line = (f"NIXL {n / down / 1e9:.2f} GB/s {where}->DRAM, {n / up / 1e9:.2f} GB/s DRAM->{where}; "
            f"host->host copy {n / host_copy / 1e9:.2f} GB/s")
    if not gpu:
        c.line("INFO", f"{mib} MiB rates", line)
        return
    d2h = _timed(lambda: _copy(host, dev, True), repeats)
    h2d = _timed(lambda: _copy(dev, host, True), repeats)
    line += f"; cudaMemcpy {n / d2h / 1e9:.2f} GB/s D2H, {n / h2d / 1e9:.2f} GB/s H2D"
    if mib < 256:
        c.line("INFO", f"{mib} MiB rates", line)
        return
    c.check(d2h / down >= min_ratio and h2d / up >= min_ratio, f"{mib} MiB NIXL vs cudaMemcpy",
            f"{d2h / down:.2f}x D2H, {h2d / up:.2f}x H2D (need >= {min_ratio:g}x); " + line)


def _copy(dst, src, gpu: bool) -> float:
    import torch

    t0 = time.perf_counter()
    dst.copy_(src)
    if gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="tools/gpu_nixl_check.py")
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--dry-sizes-mib", type=int, nargs="+", default=[4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-ratio", type=float, default=0.5)
    ap.add_argument("--dry-run", action="store_true", help="host DRAM on both sides, small sizes (no GPU)")
    args = ap.parse_args(argv)
    c = Checks()
    try:
        run(args.dry_sizes_mib if args.dry_run else args.sizes_mib, args.repeats, args.min_ratio,
            not args.dry_run, c)
    except Exception as exc:  # noqa: BLE001 (a check that cannot run is a failed check)
        c.line("FAIL", "run", f"{type(exc).__name__}: {exc}")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
