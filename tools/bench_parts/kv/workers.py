"""The two processes of a ``tools/bench_kv.py`` setting (``bench_kv.py --_worker ROLE FD PLAN
OUT``): a target that owns a registered buffer and answers the initiator's requests over a
socket, and an initiator that shakes hands, then times every (op, layout, bytes) cell."""

from __future__ import annotations

import json
import os
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from tools.bench_parts.kv.buffers import descs, fill_pattern, logical_digest, page_buffer, parse_layout, permutation
from tools.bench_parts.kv.cma import raw_cma_write
from tools.bench_parts.kv.nixl import HANDSHAKE_BYTES, make_agent, wait_done
from tools.benchlib.timing import time_call


def target(conn: Connection, plan: dict) -> None:
    """Own a registered buffer; answer metadata, fill, zero and digest requests until ``quit``."""
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


def initiator(conn: Connection, plan: dict) -> dict:
    """Handshake with the target, then run every cell of ``plan``: a verified warm-up and
    ``plan["repeats"]`` timed transfers, each after a timed memcpy of the same bytes."""
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
    h = agent.initialize_xfer("WRITE", agent.get_xfer_descs(descs(laddr, one, HANDSHAKE_BYTES), "DRAM"),
                              agent.get_xfer_descs(descs(raddr, one, HANDSHAKE_BYTES), "DRAM"), remote)
    wait_done(agent, h)
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
        local_rows, remote_rows = descs(laddr, np.arange(n), block), descs(raddr, permutation(n), block)
        xh, req_ms = None, None
        if op == "CMA":
            move = raw_cma_write(rpid, local_rows, remote_rows)
        else:
            lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_rows, "DRAM")
            rh = agent.prep_xfer_dlist(remote, remote_rows, "DRAM")
            idx = np.arange(n, dtype=np.int32)
            t = time.perf_counter()
            xh = agent.make_prepped_xfer(op, lh, idx, rh, idx)
            req_ms = (time.perf_counter() - t) * 1e3
            idle_s = float(plan["opts"].get("wait.sleep_us", "0")) * 1e-6
            move = lambda: wait_done(agent, xh, idle_s)  # noqa: E731
        first_ms = time_call(move) * 1e3  # warm-up, verified below
        mine = logical_digest(buf, n, block, None)
        conn.send(("digest", n, block))
        theirs = conn.recv()
        src, dst = (theirs, mine) if op == "READ" else (mine, theirs)
        if src != dst:
            raise RuntimeError(f"{op} {layout_spec} {total} B: destination differs from source")

        def copy() -> None:
            np.copyto(cdst[:total], csrc[:total])
        times, copies = [], []
        copy()
        for _ in range(plan["repeats"]):
            copies.append(time_call(copy))
            times.append(time_call(move))
        posted = -1
        if xh is not None:
            try:
                posted = int(agent.get_xfer_telemetry(xh).descCount)
            except Exception:  # telemetry unavailable
                pass
            xh.release(); lh.release(); rh.release()
        med, cmed = statistics.median(times), statistics.median(copies)
        out["cells"].append({
            "op": op, "layout": layout_spec, "nominal_bytes": nbytes, "bytes": total, "descriptors": n,
            "descriptors_posted": posted,
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


def worker_main(role: str, fd: int, plan_path: str, out_path: str) -> None:
    """A worker process: pinned to its core, ``role`` ``target`` or ``initiator`` over the
    socket ``fd``; the initiator writes its measurements to ``out_path``."""
    plan = json.loads(Path(plan_path).read_text())
    os.sched_setaffinity(0, {plan["cpus"][role]})
    conn = Connection(fd)
    if role == "target":
        target(conn, plan)
    else:
        Path(out_path).write_text(json.dumps(initiator(conn, plan)))
