"""The Markdown tables of ``tools/bench_kv.py``: memcpy per size, one row per setting
(transports, handshake), one row per measured cell."""

from __future__ import annotations

import re
import statistics

from tools.bench_parts.kv.buffers import MiB
from tools.bench_parts.kv.settings import env_text
from tools.bench_parts.kv.ucx import transport_summary
from tools.benchlib.tables import md_table


def format_report(results: list[dict], memcpy_alone_s: dict[int, float], memcpy_best_s: dict[int, float],
                  sizes: list[int]) -> str:
    """Markdown tables: memcpy, one row per setting (transports, handshake), one row per cell."""
    memcpy = []
    for s in sizes:
        inter = [c["memcpy_median_s"] for r in results for c in r.get("cells", [])
                 if c["layout"] == "whole" and c["bytes"] == s]
        im = statistics.median(inter) if inter else float("nan")
        memcpy.append([f"{s / MiB:g}", f"{memcpy_alone_s[s] * 1e3:.2f}", f"{s / memcpy_alone_s[s] / 1e9:.2f}",
                       f"{s / memcpy_best_s[s] / 1e9:.2f}", f"{im * 1e3:.2f}", f"{s / im / 1e9:.2f}"])
    settings = []
    for r in results:
        if "error" in r:
            settings.append([r["setting"], env_text(r["env"]), f"failed: {r['error']}", "", "", ""])
        else:
            settings.append([r["setting"], env_text(r["env"]), transport_summary(r["transports"]),
                             r["metadata_bytes"], f"{r['metadata_exchange_ms']:.1f}", f"{r['connect_ms']:.1f}"])
    cells = []
    for r in results:
        for c in r.get("cells", []):
            cells.append([r["setting"], c["op"], c["layout"], f"{c['bytes'] / MiB:.1f}", c["descriptors"],
                          "-" if c["req_ms"] is None else format(c["req_ms"], ".2f"), f"{c['median_s'] * 1e3:.2f}",
                          f"{c['gbps']:.2f}", f"{c['best_gbps']:.2f}", f"{c['ratio']:.2f}", f"{c['ratio_best']:.2f}",
                          f"{c['memcpy_gbps']:.2f}"])
    return "\n\n".join([
        md_table(["MiB", "memcpy alone: median ms", "GB/s", "best GB/s", "memcpy in initiator: median ms", "GB/s"],
                 memcpy, "rrrrrr"),
        md_table(["setting", "env", "transports UCX chose", "metadata B", "metadata exchange ms", "connect ms"],
                 settings, "lllrrr"),
        md_table(["setting", "op", "layout", "MiB", "descs", "req ms", "median ms", "GB/s", "best GB/s",
                  "x memcpy (median)", "x memcpy (best)", "memcpy in initiator GB/s"], cells, "lll" + "r" * 9),
    ])


def failure_reason(msg: str) -> str:
    """The line of a failed setting's output that says why (UCX's or Python's error)."""
    for pattern in (r"no active messages transport[^\n]*", r"no remote[^\n]*", r"Destination is unreachable",
                    r"\w+Error[^\n]*"):
        m = re.search(pattern, msg)
        if m:
            return m.group(0)[:160]
    return msg.strip().splitlines()[-1][:160]
