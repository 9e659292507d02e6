"""KV transfer microbenchmark: NIXL DRAM->DRAM throughput against single-thread memcpy.

What it measures, on one machine, in one run:

* **NIXL** (UCX backend) moving KV-sized buffers between two agents in **two processes** (an
  initiator and a target, as in the pipeline, where prefill and decode are separate processes),
  each pinned to its own core with ``os.sched_setaffinity`` (initiator on ``--cpus`` first core,
  target on the second). Both agents are configured as vLLM's NIXL worker configures its own
  (``nixl_agent_config(num_threads=4, capture_telemetry=True)``, progress thread on). For every
  size it times

  - ``WRITE`` (push mode: prefill writes into decode's blocks) and ``READ`` (pull mode: decode
    reads prefill's blocks), both posted by the initiator; optionally ``CMA`` (``--ops``): the
    same bytes moved by the initiator with raw ``process_vm_writev`` calls cut as UCX's cma
    transport cuts them (512 KiB segments, 16 iovecs a call), no NIXL or UCX involved: the
    kernel's ceiling for the single-copy path that NIXL's UCX backend uses here;
  - the same bytes as different descriptor lists: ``whole`` (one descriptor per buffer) and
    ``<N>`` = one descriptor per (layer, block) region of N tokens, as vLLM's NIXL connector
    describes the KV cache (a region per layer, a descriptor per block of a region). A block of
    N tokens is N x 768 B: SmolLM2-135M has 2 (K, V) x 3 KV heads x 64 head dim x 2 B (bf16) =
    768 B per token per layer (x 30 layers = 23,040 B per token). ``16`` (vLLM's GPU default
    block size) gives 12,288 B descriptors; ``128`` (vLLM's CPU default) 98,304 B. The target's
    block ids are a fixed random permutation of the initiator's, so no two neighbouring
    descriptors can be merged into one (decode's free blocks are rarely in prefill's order).

  Metadata exchange (the initiator asks, the target answers with ``get_agent_metadata()``, the
  initiator calls ``add_remote_agent``) and the first connection (``make_connection`` plus one
  4 KiB WRITE, i.e. UCX wire-up) happen once per setting, outside the timed region, and are
  reported on their own. Per cell the descriptor lists are prepared (``prep_xfer_dlist``, both
  sides; vLLM does this once per peer) and the request is built (``make_prepped_xfer``, as vLLM
  does per request: ``req ms``) before timing; the timed region is ``transfer()`` until
  ``check_xfer_state()`` returns ``DONE`` (polled in a tight loop). One untimed
  warm-up transfer per cell is verified by content: both processes hash their buffer in the
  initiator's block order (SHA-256) and the digests must match, or the run fails.

* **memcpy**: single-thread ``np.copyto`` between two preallocated, already-touched buffers of the
  same byte count. "alone" (the reference): in the parent process (no NIXL threads), pinned to
  the initiator's core, ``--repeats`` copies per size before each setting and after the last;
  the median of all of them. ``NIXL / memcpy alone`` divides NIXL GB/s by it. "in initiator"
  (a diagnostic): one copy before each timed transfer inside the initiator process, which shares
  its core with NIXL's progress thread (a busy-polling thread, as in vLLM's workers).

* **UCX transports**: each ``--tls`` setting is a set of environment variables (and NIXL options)
  given to both processes: ``default`` sets nothing (UCX chooses), ``tcp`` = ``UCX_TLS=tcp,self``,
  ``sm`` = ``UCX_TLS=sm,self``, more in ``SETTINGS`` (``--list-settings``). The transports UCX
  actually chose for the initiator's endpoint are read from UCX's own protocol-selection report
  (``UCX_PROTO_INFO=y``): ``put`` carries WRITE, ``get`` READ, ``am`` (active messages) the
  wire-up and NIXL notifications. The transports UCX offers on this machine (what
  ``ucx_info -d`` lists) are read from the UCX libraries bundled with nixl.

Figures: median of ``--repeats`` timed transfers; GB/s = 1e9 bytes per second. Target (issue):
NIXL >= 0.6 x single-thread memcpy for transfers of 64 MiB and more.

Run from the repository root (about 1-2 minutes on 2 idle cores with the defaults)::

    .venv/bin/python tools/bench_kv.py [--sizes-mib 4 16 64 256] [--repeats 5] \\
        [--tls default,sm,tcp] [--layouts whole,16,128] [--ops WRITE,READ] [--json out.json]

A custom setting: ``--setting 'NAME:VAR=VAL;VAR=VAL'`` (repeatable, appended to ``--tls``), where
a VAR is an environment variable (``UCX_TLS``, ``UCX_RNDV_THRESH``, ...), ``nixl.num_threads`` /
``nixl.prog_thread`` (agent options), another ``nixl.KEY`` (a UCX backend parameter such as
``nixl.ucx_error_handling_mode=none``), ``wait.sleep_us=N`` (the initiator sleeps N us between transfer-state checks instead of
spinning, as a worker with other work does), or ``buf.thp=1`` (transparent huge pages on the KV
buffers, as torch's ``THP_MEM_ALLOC_ENABLE=1`` gives tensors).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench_parts.kv.buffers import MiB, parse_layout  # noqa: E402
from tools.bench_parts.kv.memcpy import bench_memcpy  # noqa: E402
from tools.bench_parts.kv.nixl import HANDSHAKE_BYTES  # noqa: E402
from tools.bench_parts.kv.pair import run_pair  # noqa: E402
from tools.bench_parts.kv.report import failure_reason, format_report  # noqa: E402
from tools.bench_parts.kv.settings import DEFAULT_TLS, SETTINGS, env_text, parse_setting  # noqa: E402
from tools.bench_parts.kv.ucx import ucx_inventory  # noqa: E402
from tools.benchlib.cli import csv_list, parser  # noqa: E402
from tools.benchlib.machine import host_line  # noqa: E402
from tools.benchlib.procfs import load_1m  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402

__all__ = ["main", "parse_setting", "run_pair"]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="bench_kv.py", epilog="See the module docstring for what each figure means.")
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[4, 16, 64, 256], metavar="MIB")
    ap.add_argument("--repeats", type=int, default=5, help="timed transfers per cell (median reported)")
    ap.add_argument("--tls", default=DEFAULT_TLS, help=f"comma-separated settings (default {DEFAULT_TLS})")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME:VAR=VAL;...",
                    help="a custom setting, run after --tls (repeatable)")
    ap.add_argument("--layouts", default="whole,16,128", help="'whole' and/or block sizes in tokens")
    ap.add_argument("--ops", default="WRITE,READ", help="WRITE, READ (NIXL) and/or CMA (raw process_vm_writev)")
    ap.add_argument("--cpus", type=int, nargs=2, default=[0, 1], metavar=("INITIATOR", "TARGET"))
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per setting")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--list-settings", action="store_true")
    args = ap.parse_args(argv)
    if args.list_settings:
        for name, (env, about) in SETTINGS.items():
            print(f"{name:11s} {env_text(env):70s} {about}")
        return 0
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    sizes = [int(s * MiB) // 8 * 8 for s in args.sizes_mib]
    if min(sizes) < HANDSHAKE_BYTES:
        ap.error("sizes must be at least 4 KiB")
    ops = [o.upper() for o in csv_list(args.ops)]
    if not ops or any(o not in ("WRITE", "READ", "CMA") for o in ops):
        ap.error("--ops takes WRITE, READ and/or CMA")
    layouts = csv_list(args.layouts)
    try:
        for x in layouts:
            parse_layout(x).split(min(sizes))
        settings = [parse_setting(s) for s in csv_list(args.tls)]
        settings += [parse_setting(s) for s in args.setting]
    except ValueError as e:
        ap.error(str(e))
    cells = [(op, x, s) for op in ops for x in layouts for s in sizes]

    load_before = load_1m()
    inventory = ucx_inventory()
    # memcpy alone, in this process (no NIXL threads), before each setting and once at the end:
    # the reference is the median of all those samples, so slow phases of a shared machine
    # weigh on both sides alike.
    memcpy_samples: dict[int, list[float]] = {s: [] for s in sizes}
    results = []
    for st in settings:
        for size, secs in bench_memcpy(sizes, args.repeats, args.cpus[0]).items():
            memcpy_samples[size] += secs
        t = time.perf_counter()
        try:
            r = run_pair(st, cells, args.repeats, tuple(args.cpus), args.timeout)
        except RuntimeError as e:
            print(str(e), file=sys.stderr)
            r = {"setting": st.name, "env": st.env, "error": failure_reason(str(e))}
        r["wall_s"] = time.perf_counter() - t
        print(f"# {st.name}: {r['wall_s']:.1f} s" + (f" (failed: {r['error']})" if "error" in r else ""),
              file=sys.stderr)
        results.append(r)
        if args.json:  # so far, in case a later setting hangs or the run is cut short
            write_json(args.json, {"partial": True, "results": results})
    for size, secs in bench_memcpy(sizes, args.repeats, args.cpus[0]).items():
        memcpy_samples[size] += secs
    memcpy_s = {size: statistics.median(v) for size, v in memcpy_samples.items()}
    memcpy_best_s = {size: min(v) for size, v in memcpy_samples.items()}
    for r in results:
        for c in r.get("cells", []):
            c["memcpy_alone_gbps"] = c["nominal_bytes"] / memcpy_s[c["nominal_bytes"]] / 1e9
            c["memcpy_alone_best_gbps"] = c["nominal_bytes"] / memcpy_best_s[c["nominal_bytes"]] / 1e9
            c["ratio"] = c["gbps"] / c["memcpy_alone_gbps"]
            c["ratio_best"] = c["best_gbps"] / c["memcpy_alone_best_gbps"]

    load_after = load_1m()
    print(f"\n{host_line()}, load average {load_before:.2f} before / "
          f"{load_after:.2f} after; initiator process on core {args.cpus[0]}, target process on "
          f"core {args.cpus[1]}; median of {args.repeats}")
    if "error" in inventory:
        print(f"UCX inventory unavailable: {inventory['error']}")
    else:
        print(f"UCX {inventory['version']} ({inventory['libdir']}): transports {' '.join(inventory['transports'])}; "
              f"built, no device here: {' '.join(inventory['components_without_devices']) or '-'}")
    print()
    print(format_report(results, memcpy_s, memcpy_best_s, sizes))
    if args.json:
        write_json(args.json, {
            "argv": sys.argv[1:] if argv is None else argv, "sizes": sizes, "repeats": args.repeats,
            "cpus": args.cpus, "ucx": inventory, "load_before": load_before, "load_after": load_after,
            "memcpy_alone_median_s": {str(k): v for k, v in memcpy_s.items()}, "results": results})
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 5 and sys.argv[1] == "--_worker":
        from tools.bench_parts.kv.workers import worker_main

        worker_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        sys.exit(main())
