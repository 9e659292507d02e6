"""A run's performance report: latency percentiles, stalls and worker utilisation, as JSON and PNGs.

Usage::

    python -m pipeline.report RUN_DIR [--compare OTHER_RUN_DIR] [--out DIR] [--stall-ms 60]

reads only the run's metrics tables (:mod:`pipeline.io.metrics`: ``RUN_DIR/metrics/requests/``
and ``RUN_DIR/metrics/workers/``) and, when present, ``RUN_DIR/summary.json``, and writes into
``RUN_DIR/report/`` (or ``--out``):

``report.json``
    the numbers (see :func:`pipeline.report.summary.summarize_run` for every key);
``timeline.png``
    one row per request (sorted by ``prefill_start``): queue wait (light grey), prefill (blue),
    KV hand-off (orange, disaggregated only), a tick per output token, and every gap between
    consecutive tokens longer than the stall threshold in red. Above
    :data:`pipeline.report.plots.TIMELINE_MAX_ROWS` requests an evenly spaced subset of rows is
    drawn (the title says so);
``latency.png``
    TTFT and ITL distributions (histogram and empirical CDF; ITL on a log axis), p50/p99 marked;
    a CDF of more than :data:`pipeline.report.plots.ECDF_MAX_POINTS` values is drawn through
    that many of them, evenly spaced in rank;
``utilisation.png``
    per worker over time: running batch size (solid) and KV cache usage (dashed), one panel per
    role (prefill / decode / colocated); a worker of more than
    :data:`pipeline.report.plots.UTILISATION_MAX_POINTS` steps is drawn through that many equal
    spans of its time, each at its steps' largest value (the title says so).
``pools.png`` (a disaggregated run)
    per worker over time: rows finished that it handed off to a decode rank (solid) and rows it
    served alone in one engine (dashed: ``pools.elastic``); ``report.json``'s
    ``rows_by_worker`` has the counts (:mod:`pipeline.report.pools`).

The report reads the metrics in columns (:class:`pipeline.report.load.Requests`), a file at a
time, and computes every statistic over every value with numpy, no Python object per value
(its time and memory at 10^6 requests: ``tools/bench_scale.py records``, BENCHMARKS.md).

With ``--compare OTHER_RUN_DIR`` it also writes ``compare.json`` and ``compare.png``
(:func:`pipeline.report.compare.compare_reports`: RUN_DIR is "a", OTHER_RUN_DIR is "b"), e.g. a
colocated and a disaggregated run over the same input.

Definitions (all times in seconds; wall-clock epoch times in the tables, shown in the plots as
seconds since the run start = the earliest ``read_at``):

- **TTFT** (time to first token) = ``token_times[0] - prefill_start`` (queue wait excluded).
- **ITL** (inter-token latency) = the differences of consecutive ``token_times`` of one request,
  pooled over all requests. vLLM streams its outputs, and several tokens can reach the worker in
  one output with the same timestamp: those gaps are exactly 0 s and are kept (they are real:
  the tokens arrived together), so ITL percentiles count them. The log-scale ITL plots draw them
  at :data:`pipeline.report.plots.ZERO_GAP_PLOT_S` and say how many there are.
- **stall** = one ITL gap longer than the threshold (``stall_s``, default 0.060 s).
- **KV hand-off** = ``token_times[0] - prefill_end``: from the prefill worker having the KV ready
  to the first output token on the decode worker (transfer + decode scheduling). Disaggregated
  requests only (``prefill_end`` is null in colocated runs).
- **queue wait** = ``prefill_start - read_at``; **prefill time** = ``prefill_end -
  prefill_start`` (disaggregated only).
- **busy fraction** of a worker: its step rows sorted by ``t``; vLLM takes the step's scheduler
  stats after the step's outputs are processed, so ``running`` at row i is the state from
  ``t[i]`` until the next step ``t[i+1]``. busy = sum of ``t[i+1] - t[i]`` over the rows with
  ``running > 0``, divided by the worker's active span ``t[last] - t[first]``. For a prefill
  worker, the union of its rows' prefill intervals (``prefill_start`` to ``prefill_end``) when
  that is larger: a prefill usually starts and ends within one step, so no step sees it running.
- **batch size**: ``running`` of a step; its mean is taken over the steps with ``running > 0``.

Percentiles are ``numpy.percentile`` with its default ``method="linear"`` (Hyndman & Fan type 7:
linear interpolation between the two nearest order statistics; p50 of [1, 2, 3, 4] is 2.5), over
every value (no binning). A statistic over no values is ``null`` in the JSON.

Every statistic uses every request metrics row that has the needed columns, error rows included
(an error row's tokens were really produced and timed); ``errors`` counts them.

Modules (import from the one that owns a name; this package re-exports nothing):

- :mod:`pipeline.report.load`: ``load_run``, a run directory's metrics tables and summary;
- :mod:`pipeline.report.summary`: ``summarize_run``, ``worker_stats`` and the numbers of
  ``report.json`` (percentiles, stalls, utilisation);
- :mod:`pipeline.report.plots`: the PNGs (timeline, latency, utilisation, compare);
- :mod:`pipeline.report.text`: ``summary_text``, a report's headline numbers as text;
- :mod:`pipeline.report.write`: ``write_report``, ``report.json`` and the PNGs of one run;
- :mod:`pipeline.report.compare`: ``compare_reports``, two runs side by side;
- :mod:`pipeline.report.card`: ``write_card`` and ``card_mismatches``, the output folder's card
  (``_card.json``, ``_card.md``: what made it, and what it holds), which the command line checks
  against the output shards (exit status 1 when they differ);
- :mod:`pipeline.report.cli`: ``main``, the command line (``python -m pipeline.report``).
"""
