"""The P/D table of ``tools/bench.py`` (issue #17): per workload, colocated and every
disaggregated variant that ran, side by side, with each pool's busy fraction, the hand-off
against its target, and the prefill engine's CPU."""

from __future__ import annotations

import statistics
from typing import Any

from tools.bench_parts.e2e.configs import CONFIGS
from tools.benchlib.stats import median_of as med, ratio
from tools.benchlib.tables import fmt, md_table

#: The columns, in this order, where they ran.
VARIANTS = ("coloc2", "disaggbefore", "disaggpush", "disaggsync", "disaggasyncload", "disagg", "disaggdram", "disagglocal",
            "disaggtp3p", "disaggtp3d", "auto")


def _busy(r: dict, role: str) -> float | None:
    vals = [v for w, v in (r.get("busy_fraction") or {}).items() if w.startswith(role) and v is not None]
    return max(vals) if vals else None


def _cores(r: dict, suffix: str) -> float:
    return sum(v for p, v in r["cpu"]["cores_by_process"].items() if p.startswith("prefill") and p.endswith(suffix))


def _step(r: dict, role: str, key: str) -> float | None:
    vals = [d.get(key) for w, d in (r.get("steps") or {}).items() if w.startswith(role) and d.get(key) is not None]
    return max(vals) if vals else None


def _handoff(r: dict, key: str) -> float | None:
    return (r.get("handoff") or {}).get(key)


def _waiting(r: dict) -> float | None:
    """The hand-off p50 less the NIXL transfer p50: messages, waiting for an engine step."""
    total, xfer = r.get("kv_handoff_p50_s"), _handoff(r, "nixl_transfer_p50_s")
    return None if total is None or xfer is None else total - xfer


def _per_request(r: dict, key: str, unit: float = 1.0) -> float | None:
    h = r.get("handoff") or {}
    return h[key] / h["requests"] / unit if h.get(key) is not None and h.get("requests") else None


def _median(runs: list[dict], f) -> float | None:
    vals = [v for v in (f(r) for r in runs) if v is not None]
    return statistics.median(vals) if vals else None


def _auto_choice(runs: list[dict]) -> str:
    picks = sorted({r.get("auto_choice") or "?" for r in runs})
    return "; ".join(picks)


def handoff_target(runs: list[dict]) -> float | None:
    """The issue's hand-off target for these runs: the median NIXL transfer of a request plus two
    median decode steps that computed tokens (seconds)."""
    nixl = _median(runs, lambda r: (r.get("handoff") or {}).get("nixl_transfer_p50_s"))
    step = _median(runs, lambda r: _step(r, "decode", "token_step_p50_s"))
    return None if nixl is None or step is None else nixl + 2 * step


def table_variants(res: dict[str, list[dict]], wl: str) -> tuple[str, dict[str, Any]]:
    """Workload ``wl``: one column per configuration of :data:`VARIANTS` that ran; and facts (per
    configuration: tok/s ratio to colocated, busier pool's busy fraction, hand-off p50 and target)."""
    names = [n for n in VARIANTS if res.get(f"{n}-{wl}")]
    runs = {n: res[f"{n}-{wl}"] for n in names}
    col = runs.get("coloc2", [])
    base = med(col, "output_tokens_per_s_per_owner_sum")

    def row(label, f, unit=""):
        return [label] + [fmt(_median(runs[n], f), unit) for n in names]
    rows = [
        row("output tok/s (start-up removed)", lambda r: r.get("output_tokens_per_s_per_owner_sum")),
        ["  / colocated"] + [fmt(ratio(base, med(runs[n], "output_tokens_per_s_per_owner_sum")), "x") for n in names],
        row("TTFT p50 (s)", lambda r: r.get("ttft_p50_s"), "s"),
        row("ITL max (ms)", lambda r: r.get("itl_max_s"), "ms"),
        row("hand-off p50 (ms): prefill end -> first decode token", lambda r: r.get("kv_handoff_p50_s"), "ms"),
        row("hand-off p99 (ms)", lambda r: r.get("kv_handoff_p99_s"), "ms"),
        row("  of the p50: NIXL transfer p50 (ms)", lambda r: _handoff(r, "nixl_transfer_p50_s"), "ms"),
        row("  of the p50: the rest, waiting (ms)", lambda r: _waiting(r), "ms"),
        row("KV moved per request (MB)", lambda r: _per_request(r, "nixl_bytes_total", 1e6)),
        row("NIXL transfers per request", lambda r: _per_request(r, "nixl_transfers")),
        ["hand-off target (ms): NIXL transfer p50 + 2 decode steps p50"] +
        ["" if n == "coloc2" else fmt(handoff_target(runs[n]), "ms") for n in names],
        row("decode step p50 (ms), steps that computed tokens", lambda r: _step(r, "decode", "token_step_p50_s"), "ms"),
        row("busy fraction: prefill pool", lambda r: _busy(r, "prefill")),
        row("busy fraction: decode pool", lambda r: _busy(r, "decode")),
        row("prefill engine CPU (cores): engine core + model worker",
            lambda r: _cores(r, " engine core") + _cores(r, " model worker") if "disagg" in r["config"] else None),
        ["pools=auto chose"] + [_auto_choice(runs[n]) if n == "auto" else "" for n in names],
        row("prefill engine steps (no token computed)", lambda r: _step(r, "prefill", "steps")),
        row("  of which computed no token", lambda r: _step(r, "prefill", "idle_steps")),
    ]
    text = md_table(["metric"] + [CONFIGS[f"{n}-{wl}"][2] for n in names], rows)
    facts = {}
    for n in names:
        if n == "coloc2":
            continue
        busier = _median(runs[n], lambda r: max(x for x in (_busy(r, "prefill"), _busy(r, "decode"), 0.0) if x is not None))
        facts[n] = {"tps_ratio": ratio(base, med(runs[n], "output_tokens_per_s_per_owner_sum")),
                    "busier_pool_busy": busier, "handoff_p50_s": med(runs[n], "kv_handoff_p50_s"),
                    "handoff_target_s": handoff_target(runs[n])}
    return text, facts
