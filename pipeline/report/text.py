"""A report's headline numbers as a few lines of text (what the command line prints)."""

from __future__ import annotations

from typing import Any


def ms(x: float | None) -> str:
    """Seconds as milliseconds text (``-`` for None)."""
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def stalls_text(report: dict[str, Any], setting: str = "--stall-ms") -> str:
    """The stall count of ``report``, or, when the run's median ITL is itself above the stall
    threshold (every decode step of this hardware is slower than it), a sentence saying so and
    naming ``setting``, the threshold's setting: then the count is the number of steps, not of
    stalls."""
    threshold = f"{report['stall_threshold_s'] * 1e3:g} ms"
    if report.get("itl_p50_above_stall_threshold"):
        return (f"stalls: not counted, every step is slower than {threshold} on this hardware "
                f"(ITL p50 {ms(report['itl_p50_s'])}); set {setting} above it to count stalls")
    return f"stalls (> {threshold}) {report['stalls']} in {report['requests_with_stalls']} requests"


def kv_text(counts: dict[str, int] | None) -> str | None:
    """Whether the KV moved, in one line, from a run's
    :func:`pipeline.roles.recompute.kv_counts` (``decode_kv`` in ``report.json`` and
    ``summary.json``): rows whose KV decode loaded, prompt tokens decode computed, and a warning
    when decode recomputed any row's prompt (its KV did not arrive). None when no row went
    through a decode worker (a colocated run, or counts not recorded)."""
    if not counts or not (counts.get("rows") or counts.get("local_rows")):
        return None
    rows = counts["rows"]
    text = (f"KV: decode loaded the KV of {counts['kv_loaded_rows']} of {rows} rows handed off, and computed "
            f"{counts['computed_tokens']} of their {counts['prompt_tokens']} prompt tokens (at most 1 a "
            f"row when its KV arrived)")
    if counts.get("local_rows"):
        text += (f" | {counts['local_rows']} rows prefilled on decode on purpose "
                 f"(pools.local_prefill_tokens): {counts['local_tokens']} prompt tokens")
    if counts.get("recomputed_rows"):
        text += (f" | warning: decode recomputed the prompt of {counts['recomputed_rows']} of {rows} rows "
                 f"({counts['recomputed_tokens']} prompt tokens): their KV did not arrive (transport.on_recompute)")
    return text


def summary_text(report: dict[str, Any], setting: str = "--stall-ms") -> str:
    """A few lines of text with the headline numbers of a report (``setting``: the stall
    threshold's setting, see :func:`stalls_text`)."""
    tps = report["output_tokens_per_s"]
    hit = report["prefix_cache_hit_rate"]
    wrong = (report.get("checked_against_output") or {}).get("mismatches")
    counts = (f"error: these figures do not match the output ({'; '.join(wrong)}); see the run's "
              f"output shards and done markers" if wrong else
              f"requests {report['requests']} (errors {report['errors']}) | "
              f"output tokens {report['output_tokens']} | wall {report['wall_s']:.2f} s | "
              f"{'-' if tps is None else f'{tps:.1f}'} output tok/s")
    lines = [
        f"{report['mode']} run: {counts}",
        f"TTFT p50 {_s(report['ttft_p50_s'])} p99 {_s(report['ttft_p99_s'])} | "
        f"ITL p50 {ms(report['itl_p50_s'])} p99 {ms(report['itl_p99_s'])} "
        f"max {ms(report['itl_max_s'])}",
        f"{stalls_text(report, setting)} | KV hand-off p50 {ms(report['kv_handoff_p50_s'])} "
        f"p99 {ms(report['kv_handoff_p99_s'])} | KV {report['kv_total_bytes'] / 2**20:.1f} MiB | "
        f"prefix cache hit {'-' if hit is None else f'{hit:.1%}'}",
    ]
    kv = kv_text(report.get("decode_kv"))
    if kv:
        lines.append(kv)
    for name, w in report["workers"].items():
        busy = w["busy_fraction"]
        kv = w["max_kv_cache_usage"]
        mean = w["mean_batch_size"]
        lines.append(f"  {name} ({w['role']}): busy {'-' if busy is None else f'{busy:.0%}'}, "
                     f"batch mean {'-' if mean is None else f'{mean:.1f}'} max {w['max_batch_size']}, "
                     f"KV cache max {'-' if kv is None else f'{kv:.0%}'}")
    return "\n".join(lines)
