"""One setting of ``tools/bench_kv.py``: a target and an initiator process (see
:mod:`tools.bench_parts.kv.workers`), started with the setting's environment, and the
initiator's measurements."""

from __future__ import annotations

import json
import mmap
import os
import socket
import tempfile
from pathlib import Path

from tools.bench_parts.kv.nixl import HANDSHAKE_BYTES
from tools.bench_parts.kv.settings import Setting
from tools.bench_parts.kv.ucx import proto_transports
from tools.benchlib import REPO
from tools.benchlib.procs import python, spawn, stop, wait_all

ROLES = ("initiator", "target")


def run_pair(setting: Setting, cells: list[tuple[str, str, int]], repeats: int,
             cpus: tuple[int, int] = (0, 1), timeout: float = 300.0, digest_before: bool = False) -> dict:
    """Start a target and an initiator process (NIXL agents with the UCX backend, pinned to
    ``cpus``) with ``setting``'s environment; run each cell (op ``WRITE``/``READ``/``CMA``, layout spec,
    bytes) once as a content-verified warm-up and then ``repeats`` timed times.

    Returns the initiator's measurements: ``metadata_bytes``, ``metadata_exchange_ms``,
    ``connect_ms``, ``transports`` (see :func:`~tools.bench_parts.kv.ucx.proto_transports`) and
    ``cells``, each with ``bytes``, ``descriptors``, ``median_s``, ``gbps``, ``memcpy_gbps``
    (memcpy in the initiator, interleaved with the transfers),
    ``src_digest``/``dst_digest`` (SHA-256 of source and destination in block order, equal) and,
    with ``digest_before``, ``dst_digest_before`` (the destination before the transfer).

    Raises:
        RuntimeError: a process failed or timed out (its log tail is in the message), or the
            destination differed from the source.
    """
    need = max(HANDSHAKE_BYTES, max(b for _, _, b in cells))
    plan = {"cells": cells, "repeats": repeats, "buffer_bytes": -(-need // mmap.PAGESIZE) * mmap.PAGESIZE,
            "opts": setting.opts, "cpus": dict(zip(ROLES, cpus)), "digest_before": digest_before}
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env.update(setting.environ)
    env.setdefault("NIXL_LOG_LEVEL", "WARN")
    env.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")  # vllm/distributed/nixl_utils.py sets this too
    with tempfile.TemporaryDirectory(prefix="bench_kv_") as tmp:
        plan_path, out_path = Path(tmp) / "plan.json", Path(tmp) / "out.json"
        plan_path.write_text(json.dumps(plan))
        ends = dict(zip(ROLES, socket.socketpair()))
        procs, logs, text = {}, {}, {}
        try:
            for role in ("target", "initiator"):
                penv = dict(env, UCX_PROTO_INFO="y") if role == "initiator" else env
                logs[role] = open(Path(tmp) / f"{role}.log", "w+")
                fd = ends[role].fileno()
                cmd = python(REPO / "tools" / "bench_kv.py", "--_worker", role, fd, plan_path, out_path)
                procs[role] = spawn(cmd, logs[role], penv, pass_fds=[fd])
            for end in ends.values():
                end.close()
            wait_all([procs[r] for r in ROLES], timeout)
        finally:
            for p in procs.values():
                stop(p)
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
