"""The xP:yD planner: size the prefill and decode pools for a workload on a given machine, and say
whether to disaggregate at all.

``python -m pipeline.plan --model llama-3.1-70b --hardware h100 --prompt-tokens 8192
--output-tokens 256 --rate 2.0`` prints the predictions, the recommendation and the Hydra
overrides that run it (``--json`` for machine output; ``--input DIR`` counts the prompt tokens of
a Parquet dataset with the model's tokenizer; ``--calibrate RUN_DIR`` fits the ``cpu`` profile to
a finished run; ``--kv-cache-dtype`` sizes the KV cache; ``--batch-rows`` is the pipeline's
``job.batch_rows``; ``--device-hour-price`` prices each option per million output tokens).

The model (all quantities per request unless said otherwise; one *worker* is ``tp`` devices):

- KV bytes per token ``k = 2 x layers x KV heads x head dim x bytes per element`` of the KV cache
  dtype (``auto``: the model's; fp8: 1 byte; :mod:`pipeline.engine.kv_layout`); a request moves
  ``k x prompt tokens`` bytes from prefill to decode in ``T = bytes / (tp x link bandwidth)``
  seconds, and its hand-off takes ``H = T +`` the hardware's ``handoff_s`` (0 for the presets,
  fitted by calibration).
- Prefill FLOPs ``F(L) = 2 N L + 2 n_layer L^2 d_attn`` for an ``L``-token prompt, ``N`` the
  non-embedding parameters and ``d_attn`` = heads x head dim. Kaplan et al. 2020, "Scaling Laws
  for Neural Language Models", Table 1: forward FLOPs per token ``2N + 2 n_layer n_ctx d_attn``;
  summed over a causal prompt (token ``i`` attends to ``i`` tokens: ``4 i d_attn`` per layer for
  QK^T and AV) this is ``2 n_layer L^2 d_attn``. The LM head runs on the last token only (vLLM),
  so it is left out. Prefill time ``S = F / (tp x peak FLOP/s x MFU)`` (compute bound; see also
  kipply, "Transformer Inference Arithmetic", 2022).
- TTFT ``= Wq + S (+ H when disaggregated)``, ``Wq`` the M/G/1 wait of one prefill worker fed
  ``rate / x`` requests/s (Pollaczek-Khinchine): ``Wq = lambda E[S^2] / (2 (1 - rho))``,
  ``rho = lambda E[S]``. With one prompt length the service is deterministic and this is the
  M/D/1 wait ``rho / (2 mu (1 - rho))``, ``mu = 1 / S``.
- Decode step (one inter-token gap, ITL) on a worker running ``n`` sequences: the roofline
  ``max(bytes / (tp x memory BW x MBU), FLOPs / (tp x peak x MFU))`` with bytes = all weights
  + ``n x k x c`` (the KV of every running sequence; ``c`` its time-averaged context,
  ``E[o (p + o/2)] / E[o]`` tokens) and FLOPs = ``n x (2 (N + vocab x hidden) + 4 n_layer c
  d_attn)`` (kipply 2022; Pope et al. 2022, "Efficiently Scaling Transformer Inference").
  Concurrency by Little's law ``n = lambda_d x E[o] x ITL(n)``, ``lambda_d = rate / y``; ITL
  grows with ``n``, so the fixed point is solved (both roofline branches are affine in ``n``).
- Colocated (one engine does both): prefills pre-empt decoding, so a worker with prefill
  utilisation ``rho`` decodes at mean ITL ``ITL(n) / (1 - rho)`` and its worst gap is
  ``ITL(n) + S(p99 prompt)``: one whole prefill lands inside an inter-token gap.
- Utilisation: prefill ``max(rate x E[S], rate x T) / x``; decode ``max(n / max batch,
  n x k x c / KV capacity, rate x T / y)``, KV capacity = ``tp x memory x mem_fraction -
  weights`` (or the fixed CPU KV space). The split is the smallest x and y (so the smallest
  x + y: the two pools load independently) with both at most the target (0.75).

The decode host-DRAM KV tier (``--dram-tier``, :func:`pipeline.plan.dram.dram_tier`): prefill
pushes a finished request's KV into host DRAM on its decode worker, the decode worker loads it
into its KV cache (HBM) when it admits the request and swaps sequences out to DRAM and back
instead of recomputing. A decode worker has ``c`` slots: sequences its KV cache holds at full
length ``p + o``; a request stays in a slot ``W = load + o x ITL``. Requests in DRAM per worker, by
Little's law ``L = lambda W``: ``lambda_d x (T + Wq + load)`` (pushing, waiting for a slot,
loading; ``Wq`` the Erlang C wait of an M/M/c queue) plus the sequences swapped out; DRAM =
``ceil(headroom x that)`` requests x ``k x (p + o)`` bytes. See
:func:`pipeline.plan.dram.dram_tier`.

A batch job (a request count, no rate) has no arrival process: every request is there at the
start and the pools run as fast as they can. ``--workers G`` (default 2, the pipeline's 1P:1D)
are split into the xP:yD with the shortest makespan and compared with G colocated workers (see
:func:`pipeline.plan.predict.predict` for the makespan of each). Each worker keeps ``job.batch_rows``
rows in flight, which sets the batch's TTFT (:func:`pipeline.plan.queueing.batch_ttft`).

Cost (:mod:`pipeline.plan.price`): devices x price per device-hour = price per hour; per million
output tokens ``price per hour / (output tokens/s x 3600) x 1e6``.

Modules (import a name from the one that owns it; this package re-exports nothing):

- :mod:`~pipeline.plan.units`: GB, GiB, TiB; seconds as the reports print them.
- :mod:`~pipeline.plan.hardware`: :class:`Hardware` and its presets (``h100``, ``h200``, ``cpu``).
- :mod:`~pipeline.plan.model`: :class:`ModelShape`, model presets, :func:`load_model`.
- :mod:`~pipeline.plan.workload`: :class:`Workload`, explicit or counted from a Parquet dataset.
- :mod:`~pipeline.plan.costs`: per-request FLOPs and seconds, the decode roofline, KV capacity.
- :mod:`~pipeline.plan.queueing`: M/D/1, M/G/1 and M/M/c (Erlang C) waits; a batch's TTFT.
- :mod:`~pipeline.plan.predict`: :class:`Prediction` of one pool configuration.
- :mod:`~pipeline.plan.dram`: the decode host-DRAM KV tier, :class:`DramTier`.
- :mod:`~pipeline.plan.price`: cost per million output tokens of each option.
- :mod:`~pipeline.plan.recommend`: :func:`plan`, the split and the recommendation.
- :mod:`~pipeline.plan.calibrate`: fit the ``cpu`` profile to a finished run.
- :mod:`~pipeline.plan.format`: the readable report.
- :mod:`~pipeline.plan.cli`: ``python -m pipeline.plan``.
"""
