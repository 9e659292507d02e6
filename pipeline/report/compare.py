"""Two runs side by side (e.g. colocated and disaggregated over the same input): ``compare.json``
and ``compare.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pipeline.report.load import load_run
from pipeline.report.plots import plot_compare
from pipeline.report.summary import STALL_S, json_float, latencies, summarize
from pipeline.report.write import write_json

RATIO_KEYS = ("output_tokens_per_s", "ttft_p99_s", "itl_p99_s", "itl_max_s", "stalls")
"""The ratios b / a in ``compare.json``."""

SIDE_BY_SIDE_KEYS = (
    "mode", "requests", "errors", "output_tokens", "wall_s", "output_tokens_per_s",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_max_s",
    "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s",
    "kv_handoff_p50_s", "kv_handoff_p99_s", "queue_wait_p50_s", "queue_wait_p99_s",
    "prefill_p50_s", "prefill_p99_s", "kv_total_bytes", "stalls", "requests_with_stalls",
    "prefix_cache_hit_rate", "mean_batch_size", "max_batch_size", "max_kv_cache_usage",
)


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return json_float(b / a)


def compare_reports(run_a: str | Path, run_b: str | Path, out_dir: str | Path,
                    labels: Sequence[str] = ("a", "b"), stall_s: float = STALL_S) -> dict[str, Any]:
    """Compare two runs (e.g. colocated = a, disaggregated = b, over the same input): writes
    ``compare.json`` and ``compare.png`` into ``out_dir`` and returns the JSON's content:

    - ``labels``: [label a, label b];
    - ``a``, ``b``: each run's :func:`pipeline.report.summary.summarize_run` (plus ``label``);
    - ``side_by_side``: metric -> [a, b] for the headline metrics;
    - ``ratios_b_over_a``: b / a of ``output_tokens_per_s``, ``ttft_p99_s``, ``itl_p99_s``,
      ``itl_max_s`` and ``stalls`` (null where a's value is 0 or either is missing);
    - ``files``: name -> path.

    ``compare.png``: ITL CDFs of both runs on one log axis, TTFT CDFs, and bars of output
    tokens/s and stalls.

    Raises:
        FileNotFoundError, ValueError: see :func:`pipeline.report.load.load_run`; ValueError for
        two equal labels.
    """
    labels = tuple(str(x) for x in labels)
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"compare needs two different labels, got {labels!r}")
    out = Path(out_dir)
    loaded = [load_run(Path(r)) for r in (run_a, run_b)]
    reports = [summarize(Path(r), *ld, stall_s) for r, ld in zip((run_a, run_b), loaded)]
    for rep, lab in zip(reports, labels):
        rep["label"] = lab
    lats = [latencies(ld[0]) for ld in loaded]
    out.mkdir(parents=True, exist_ok=True)
    png = out / "compare.png"
    plot_compare(reports, lats, labels, png, stall_s)
    result = {
        "labels": list(labels),
        "stall_threshold_s": float(stall_s),
        "a": reports[0],
        "b": reports[1],
        "side_by_side": {k: [reports[0].get(k), reports[1].get(k)] for k in SIDE_BY_SIDE_KEYS},
        "ratios_b_over_a": {k: _ratio(reports[0].get(k), reports[1].get(k)) for k in RATIO_KEYS},
        "files": {"compare": str(out / "compare.json"), "compare_png": str(png)},
    }
    write_json(out / "compare.json", result)
    return result
