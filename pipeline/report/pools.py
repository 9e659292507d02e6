"""How a disaggregated run's rows were served, per worker (issue #40, ``pools.elastic``): handed
off from a prefill worker to a decode rank, or served alone in one engine (a prefill worker's
row while every decode rank was full, a decode rank's own unit); in ``report.json``
(``rows_by_worker``) and ``pools.png``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.report.load import Requests

ROLES = ("prefill-", "decode-")


def _columns(cols: Requests) -> tuple[list[str | None], np.ndarray, np.ndarray]:
    """(each row's serving worker, whether it was handed off, whether it is an error row)."""
    import pyarrow.compute as pc

    t = cols.table
    worker = pc.cast(t.column("prefill_worker"), "string").to_pylist()
    handed = pc.is_valid(t.column("decode_worker")).to_numpy(zero_copy_only=False)
    error = pc.is_valid(t.column("error")).to_numpy(zero_copy_only=False)
    return worker, handed, error


def rows_by_worker(cols: Requests) -> dict[str, dict[str, int]]:
    """Worker (its ``prefill_worker`` name) -> ``handed_off`` (rows it prefilled and handed to a
    decode rank), ``alone`` (rows it served in its own engine, prefill and decode) and
    ``errors`` (error rows it wrote); {} for a colocated run (no prefill worker or decode rank
    served a row)."""
    worker, handed, error = _columns(cols)
    out: dict[str, dict[str, int]] = {}
    for w, h, e in zip(worker, handed, error):
        if w is None:
            continue
        d = out.setdefault(w, {"handed_off": 0, "alone": 0, "errors": 0})
        d["errors" if e else "handed_off" if h else "alone"] += 1
    return out if any(w.startswith(ROLES) for w in out) else {}


def plot_pools(cols: Requests, path: Path, start: float) -> None:
    """``pools.png``: per worker, rows finished over time (at their last token, seconds since the
    run start), handed off (solid) and served alone (dashed); rows without a token not drawn."""
    from pipeline.report.plots import _plt

    plt = _plt()
    worker, handed, error = _columns(cols)
    last = cols.last - start
    fig, ax = plt.subplots(figsize=(12, 4))
    cmap = plt.get_cmap("tab10")
    for k, w in enumerate(sorted({w for w in worker if w is not None})):
        mine = np.array([x == w for x in worker])
        for kind, style, sel in (("handed off", "-", handed), ("alone", "--", ~handed)):
            t = np.sort(last[mine & sel & ~error & np.isfinite(last)])
            if t.size:
                ax.step(np.concatenate([[0.0], t]), np.arange(t.size + 1), where="post", color=cmap(k % 10),
                        linestyle=style, label=f"{w}: {kind} ({t.size})")
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("rows finished")
    ax.set_title("rows by worker: handed off to a decode rank (solid) or served alone in one engine (dashed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
