"""The planner's answer: :func:`plan` sizes the disaggregated split and the colocated pool for a
workload and recommends one (:class:`Plan`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from pipeline.plan.costs import auto_tp, decode_concurrency, decode_step_time
from pipeline.plan.dram import DramTier, dram_tier
from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.predict import Prediction, decode_worker_util, fewest_workers, predict, prefill_side
from pipeline.plan.price import OptionCost
from pipeline.plan.units import GB, secs
from pipeline.plan.workload import Workload


@dataclass(frozen=True)
class PlanOptions:
    """What the planner aims at and the pools' shapes (:func:`plan`).

    ``target_util``: the highest utilisation a pool may run at, in (0, 1); ``itl_target_s``: the
    inter-token latency, seconds, above which a colocated worker's stalls count;
    ``tail_quantile``: the share of gaps that must stay unstalled to recommend colocated;
    ``workers``: the workers a batch (no rate) is split across; ``rows_in_flight``: per prefill
    or colocated worker (the pipeline's ``job.batch_rows``; None: unbounded); ``dram_headroom``:
    size the decode host-DRAM KV tier with this headroom (None: no tier). ``prefill_tp`` devices
    per prefill and colocated worker and ``decode_tp`` per decode worker, each defaulting to
    ``tp``, itself defaulting to :func:`~pipeline.plan.costs.auto_tp`.
    """

    target_util: float = 0.75
    itl_target_s: float = 0.1
    tail_quantile: float = 0.99
    workers: int = 2
    rows_in_flight: int | None = None
    dram_headroom: float | None = None
    tp: int | None = None
    prefill_tp: int | None = None
    decode_tp: int | None = None


@dataclass
class Plan:
    """The planner's answer: the model, hardware and workload it used, the smallest
    disaggregated split and colocated pool under ``target_util``, which to run and why, and the
    Hydra overrides for it; ``costs``, each option's price per million output tokens when device
    prices were given (:func:`pipeline.plan.price.option_costs`)."""

    model: ModelShape
    hardware: Hardware
    workload: Workload
    target_util: float
    itl_target_s: float
    disaggregated: Prediction | None
    colocated: Prediction
    recommendation: str
    reason: str
    overrides: str
    notes: list[str] = field(default_factory=list)
    dram: DramTier | None = None
    costs: list[OptionCost] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Everything as JSON-ready data (``--json``); lists of lengths are summarised."""
        wl = self.workload
        d = {
            "model": {**asdict(self.model), "kv_dtype": self.model.kv_dtype,
                      "kv_bytes_per_token": self.model.kv_bytes_per_token,
                      "weight_bytes": self.model.weight_bytes, "flop_params": self.model.flop_params},
            "hardware": asdict(self.hardware),
            "workload": {"source": wl.source, "rate": wl.rate, "count": wl.count,
                         "requests_listed": len(wl.prompt_tokens),
                         "prompt_tokens_mean": wl.mean_prompt, "prompt_tokens_p99": wl.p99_prompt,
                         "output_tokens_mean": wl.mean_output, "decode_context_tokens": wl.decode_context},
            "target_util": self.target_util, "itl_target_s": self.itl_target_s,
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "disaggregated": None, "colocated": None,
            "recommendation": self.recommendation, "reason": self.reason,
            "overrides": self.overrides, "notes": self.notes,
        }
        for key in ("disaggregated", "colocated"):
            p = getattr(self, key)
            if p is not None:
                d[key] = {**asdict(p), "devices": p.devices, "overrides": p.overrides}
        if self.dram is not None:
            d["dram_tier"] = asdict(self.dram)
        if self.costs:
            d["costs"] = [asdict(c) for c in self.costs]
        return _finite(d)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def plan(model: ModelShape, hw: Hardware, wl: Workload, options: PlanOptions | None = None, **fields) -> Plan:
    """Size the pools and recommend colocated or disaggregated; with ``dram_headroom`` also size
    the decode host-DRAM KV tier of the disaggregated split (:func:`dram_tier`, ``Plan.dram``).
    ``options`` (:class:`PlanOptions`, its defaults when None), with ``fields`` (any of its
    fields by name) replacing its own.

    With a rate: ``x`` = the fewest prefill workers with prefill utilisation <= ``target_util``,
    ``y`` the fewest decode workers with decode utilisation <= ``target_util`` (the pools load
    independently, so this is the smallest x + y); the colocated pool is the fewest workers
    whose prefill share and decode concurrency both stay under the target. Recommendation:

    1. colocated when its worst-case ITL (``ITL + S(p99 prompt)``) is within ``itl_target_s``:
       there is no stall to remove, and disaggregation does not raise throughput;
    2. colocated when the load is too small to fill two pools: prefills land in fewer than
       ``1 - tail_quantile`` (1%) of a colocated worker's gaps, so its p99 ITL is not stalled;
    3. otherwise disaggregated: the colocated worst case exceeds the ITL target often enough
       to reach the tail.

    Without a rate (a batch of ``wl.count``): ``workers`` workers are split into the xP:yD of
    highest throughput and compared with ``workers`` colocated ones by makespan (ITL does not
    matter to a batch); ties go to colocated. ``rows_in_flight`` per prefill or colocated worker
    (the pipeline's ``job.batch_rows``; ``None``: unbounded) shapes a batch's TTFT and makespan
    (:func:`~pipeline.plan.predict.predict`).

    Each pool its own shape: ``prefill_tp`` devices per prefill and colocated worker and
    ``decode_tp`` per decode worker (each defaulting to ``tp``, itself defaulting to
    :func:`~pipeline.plan.costs.auto_tp`); a pool's rates and KV capacity scale with its TP
    size (:mod:`pipeline.plan.costs`) and its cost counts all its devices
    (:mod:`pipeline.plan.price`).

    Raises:
        ValueError: ``target_util`` not in (0, 1), ``workers`` < 1, or no split within 100,000
            workers; with ``dram_headroom``: as :func:`dram_tier`, or no split (``workers`` = 1).
        TypeError: a name in ``fields`` that is no field of :class:`PlanOptions`.
    """
    opts = replace(options or PlanOptions(), **fields)
    _check_options(opts)
    ptp, dtp = _pool_tps(model, hw, opts)
    if wl.rate is None:
        dis, colo, rec, reason, notes = _batch_choice(model, hw, wl, opts, ptp, dtp)
    else:
        dis, colo, rec, reason, notes = _rate_choice(model, hw, wl, opts, ptp, dtp)
    overrides = (dis if rec == "disaggregated" else colo).overrides
    if hw.kv_cache_bytes is None:
        overrides += f" model.gpu_memory_utilization={hw.mem_fraction:g}"
    notes += _hardware_notes(model, hw, ptp, dtp)
    dram = _dram(model, hw, wl, opts, dis, rec)
    return Plan(model, hw, wl, opts.target_util, opts.itl_target_s, dis, colo, rec, reason, overrides, notes, dram)


def _check_options(opts: PlanOptions) -> None:
    """Raises ValueError: ``target_util`` not in (0, 1), or ``workers`` < 1."""
    if not 0 < opts.target_util < 1:
        raise ValueError(f"target utilisation must be in (0, 1), got {opts.target_util}")
    if opts.workers < 1:
        raise ValueError(f"workers must be >= 1, got {opts.workers}")


def _pool_tps(model: ModelShape, hw: Hardware, opts: PlanOptions) -> tuple[int, int]:
    """(devices per prefill and colocated worker, per decode worker): each pool's own TP, else
    ``tp``, else :func:`auto_tp` (asked only where a pool's TP is left to it)."""
    tp = opts.tp
    if not (tp or (opts.prefill_tp and opts.decode_tp)):
        tp = auto_tp(model, hw)
    return opts.prefill_tp or tp, opts.decode_tp or tp


def _batch_choice(model: ModelShape, hw: Hardware, wl: Workload, opts: PlanOptions, ptp: int,
                  dtp: int) -> tuple[Prediction | None, Prediction, str, str, list[str]]:
    """A batch: ``workers`` colocated against their best xP:yD split, by makespan (ties go to
    colocated). (split or None for one worker, colocated, recommendation, reason, notes)."""
    workers, rows = opts.workers, opts.rows_in_flight
    colo = predict(model, hw, wl, "colocated", workers, tp=ptp, rows_in_flight=rows)
    dis = None
    if workers >= 2:
        dis = max((predict(model, hw, wl, "disaggregated", x, workers - x, rows_in_flight=rows,
                           prefill_tp=ptp, decode_tp=dtp) for x in range(1, workers)),
                  key=lambda p: p.throughput)
    if dis is not None and dis.makespan_s < colo.makespan_s * (1 - 1e-9):
        rec = "disaggregated"
        reason = (f"batch job: disaggregated {dis.prefill_workers}P:{dis.decode_workers}D finishes in "
                  f"{secs(dis.makespan_s)}, colocated x{workers} in {secs(colo.makespan_s)}")
    else:
        rec = "colocated"
        reason = (f"batch job: only the makespan counts, and colocated x{workers} finishes in "
                  f"{secs(colo.makespan_s)}" + (f" vs {secs(dis.makespan_s)} for the best split "
                                               f"{dis.prefill_workers}P:{dis.decode_workers}D" if dis else
                                               " (one worker cannot be split into two pools)"))
    notes = [f"batch job: {wl.count} requests, all there at the start, on {workers} "
             f"worker{'s' if workers > 1 else ''} (--workers); the pools run at full speed"]
    return dis, colo, rec, reason, notes


def _rate_pools(model: ModelShape, hw: Hardware, wl: Workload, target_util: float, ptp: int,
                dtp: int) -> tuple[int, int, int]:
    """(prefill workers x, decode workers y, colocated workers): the fewest of each that keep
    the pool's utilisation at ``wl.rate`` within ``target_util``.

    Raises:
        ValueError: no pool of up to 100,000 workers does.
    """
    pf = prefill_side(model, hw, wl, ptp, dtp)
    colo_pf = prefill_side(model, hw, wl, ptp)
    rate = wl.rate
    x = math.ceil(rate * max(pf.mean_s, pf.transfer_s) / target_util * (1 - 1e-12))
    x = max(1, x)

    def dec_util(w: int) -> float:
        try:
            n, _ = decode_concurrency(model, hw, rate / w, wl.mean_output, wl.decode_context, dtp)
        except ValueError:
            return math.inf
        return max(decode_worker_util(model, hw, wl, n, dtp), rate * pf.transfer_s / w)

    def colo_util(w: int) -> float:
        rho = rate * colo_pf.mean_s / w
        if rho >= 1:
            return math.inf
        try:
            n, _ = decode_concurrency(model, hw, rate / w, wl.mean_output, wl.decode_context, ptp, 1 / (1 - rho))
        except ValueError:
            return math.inf
        return max(rho, decode_worker_util(model, hw, wl, n, ptp))

    y = fewest_workers(dec_util, target_util)
    n_colo = fewest_workers(colo_util, target_util)
    if y is None or n_colo is None:
        raise ValueError(f"no pool of up to 100,000 workers keeps {rate:g} requests/s under "
                         f"utilisation {target_util}")
    return x, y, n_colo


def _rate_choice(model: ModelShape, hw: Hardware, wl: Workload, opts: PlanOptions, ptp: int,
                 dtp: int) -> tuple[Prediction, Prediction, str, str, list[str]]:
    """A rate: the smallest split and colocated pool (:func:`_rate_pools`), and which of the
    three cases of :func:`plan` holds. (split, colocated, recommendation, reason, notes)."""
    x, y, n_colo = _rate_pools(model, hw, wl, opts.target_util, ptp, dtp)
    dis = predict(model, hw, wl, "disaggregated", x, y, prefill_tp=ptp, decode_tp=dtp)
    colo = predict(model, hw, wl, "colocated", n_colo, tp=ptp)
    itl_target_s, tail = opts.itl_target_s, 1 - opts.tail_quantile
    notes: list[str] = []
    if colo.itl_worst_s <= itl_target_s:
        rec = "colocated"
        reason = (f"colocated worst-case ITL {secs(colo.itl_worst_s)} (ITL + one p99 prefill) is within "
                  f"the {secs(itl_target_s)} target: no decode stall to remove, and disaggregation "
                  f"does not raise throughput")
    elif colo.stall_fraction < tail:
        rec = "colocated"
        reason = (f"load too small to fill two pools: prefills land in {colo.stall_fraction:.2%} of "
                  f"a colocated worker's gaps (< {tail:.0%}), so its p{opts.tail_quantile * 100:g} ITL stays "
                  f"{secs(colo.itl_s)}; {x}P:{y}D would run at prefill {dis.prefill_util:.2f}, "
                  f"decode {dis.decode_util:.2f}")
    else:
        rec = "disaggregated"
        reason = (f"colocated worst-case ITL {secs(colo.itl_worst_s)} exceeds the {secs(itl_target_s)} "
                  f"target in {colo.stall_fraction:.1%} of gaps; disaggregated ITL is {secs(dis.itl_s)}")
        if dis.itl_s > itl_target_s:
            notes.append(f"disaggregated ITL {secs(dis.itl_s)} also exceeds the target: decode is "
                         f"bound by reading the weights ({secs(decode_step_time(model, hw, 0, 0, dtp))} "
                         f"per step at best); more decode workers cannot go below that")
    return dis, colo, rec, reason, notes


def _hardware_notes(model: ModelShape, hw: Hardware, ptp: int, dtp: int) -> list[str]:
    """Notes on what the plan assumes of the hardware: vLLM's share of device memory, TP on a CPU
    profile, and the pools' TP sizes."""
    notes = []
    if hw.kv_cache_bytes is None:
        notes.append(f"assumes vLLM may use {hw.mem_fraction:.0%} of device memory "
                     f"(the pipeline's default on GPU workers, model.gpu_memory_utilization=null, is 0.9)")
    if hw.ranks_share_cores and max(ptp, dtp) > 1:
        notes.append(f"{hw.name} is a CPU profile: the rates above scale with each pool's TP as if every rank had "
                     f"its own device, but vLLM's CPU backend runs a worker's ranks on the worker's own cores, "
                     f"where TP above 1 is slower than TP 1 (BENCHMARKS.md)")
    if ptp == dtp > 1:
        notes.append(f"{ptp} devices per worker (tensor parallel): weights {model.weight_bytes / GB:.1f} GB")
    elif ptp != dtp:
        notes.append(f"{ptp} devices per prefill and colocated worker, {dtp} per decode worker (tensor "
                     f"parallel): weights {model.weight_bytes / GB:.1f} GB; the KV moves over {min(ptp, dtp)} "
                     f"link{'s' if min(ptp, dtp) > 1 else ''} per hand-off")
    return notes


def _dram(model: ModelShape, hw: Hardware, wl: Workload, opts: PlanOptions, dis: Prediction | None,
          rec: str) -> DramTier | None:
    """The decode host-DRAM KV tier of the split ``dis`` when ``dram_headroom`` is given.

    Raises:
        ValueError: no split (one worker), or as :func:`dram_tier`.
    """
    if opts.dram_headroom is None:
        return None
    if dis is None:
        raise ValueError("the DRAM tier needs a disaggregated split: give --workers >= 2")
    dram = dram_tier(model, hw, wl, dis, headroom=opts.dram_headroom, itl_target_s=opts.itl_target_s)
    if rec != "disaggregated":
        dram.notes.append(f"sized for the disaggregated split {dis.prefill_workers}P:{dis.decode_workers}D; "
                          f"the recommendation is {rec}")
    return dram
