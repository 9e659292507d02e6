"""The planner calibrated on one run, predicting every other (issue #17 §4): for each ordered
pair (A, B) of the given run directories, the ``cpu`` profile is calibrated on A
(:func:`pipeline.plan.calibrate.calibrate`) and predicts B's layout over B's own prompts and
output lengths (:func:`pipeline.plan.calibrate.workload_from_run`, A's ``job.batch_rows`` rows
in flight), as ``tests/test_metrics_report.py`` does for one pair. Printed per pair: predicted /
measured makespan (B's ``wall_s``), TTFT p50 and mean per-request ITL; then the spread of the
measured figures over the runs (max / min), which bounds what any profile fitted on one run can
reach on another::

    .venv/bin/python tools/bench_planner.py RUN_DIR RUN_DIR [RUN_DIR ...] [--layout 1:1]

The runs should share a layout (``--layout P:D``, disaggregated; ``0`` decode = colocated with P
workers). The suite's push and pull runs of the sample job are such runs
(``/tmp/pytest-of-$USER/pytest-N/{push,pull}0/run`` after a test session).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from pipeline.io.metrics import read_request_metrics  # noqa: E402
from pipeline.plan.calibrate import batch_rows_of_run, calibrate, model_of_run, workload_from_run  # noqa: E402
from pipeline.plan.predict import predict  # noqa: E402
from pipeline.report.summary import summarize_run  # noqa: E402
from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

#: Predicted / measured within which a pair counts as close: issue #17 §4 asks 20% on the
#: makespan and 1.5x on TTFT p50; 3x is the ITL bound of ``tests/test_metrics_report.py``.
BOUNDS = {"makespan": 1.2, "ttft_p50": 1.5, "itl": 3.0}


def measured(run: Path) -> dict[str, float]:
    """Makespan (``wall_s``), TTFT p50 (seconds, :func:`summarize_run`) and the mean over
    requests of each request's mean inter-token gap (seconds, from the raw token times)."""
    s = summarize_run(run)
    itl = [float(np.mean(np.diff(r["token_times"]))) for r in read_request_metrics(run).to_pylist()
           if len(r["token_times"]) > 1]
    return {"makespan": s["wall_s"], "ttft_p50": s["ttft_p50_s"], "itl": float(np.mean(itl))}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (RUN_DIR, with metrics/)")
    ap.add_argument("--layout", default="1:1", help="P:D workers of the runs (D = 0: colocated)")
    args = ap.parse_args()
    p, d = (int(x) for x in args.layout.split(":"))
    mode = "colocated" if d == 0 else "disaggregated"
    names = [f"{r.parent.parent.name}/{r.parent.name}" for r in args.runs]
    meas = [measured(r) for r in args.runs]
    workloads = [workload_from_run(r) for r in args.runs]
    rows, ratios = [], {k: [] for k in BOUNDS}
    for a, run_a in enumerate(args.runs):
        model = model_of_run(run_a)
        hw = calibrate(run_a, model)
        in_flight = batch_rows_of_run(run_a)
        for b, wl in enumerate(workloads):
            pred = predict(model, hw, wl, mode, p, d, rows_in_flight=in_flight)
            got = {"makespan": pred.makespan_s, "ttft_p50": pred.ttft_p50_s, "itl": pred.itl_s}
            r = {k: got[k] / meas[b][k] for k in ratios}
            if a != b:
                for k in ratios:
                    ratios[k].append(r[k])
            rows.append([names[a], names[b]] + [f"{r[k]:.2f}x" for k in ratios])
    print(md_table(["calibrated on", "predicts", "makespan", "TTFT p50", "ITL"], rows, "llrrr"))
    print()
    summary = []
    for k, v in ratios.items():
        within = BOUNDS[k]
        inside = sum(1 / within <= x <= within for x in v)
        spread = max(m[k] for m in meas) / min(m[k] for m in meas)
        summary.append([k, f"{statistics.median(v):.2f}x", f"{min(v):.2f}-{max(v):.2f}x",
                        f"{inside}/{len(v)} within {within:g}x", f"{spread:.2f}x"])
    print(md_table(["predicted / measured, other runs", "median", "range", "pairs", "measured max/min over runs"],
                   summary, "lrrrr"))


if __name__ == "__main__":
    main()
