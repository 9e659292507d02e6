"""Predict one pool configuration: :class:`Prediction` of a disaggregated xP:yD or a colocated
pool, at a rate (steady state) or for a batch (makespan)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.plan.costs import (auto_tp, decode_concurrency, decode_step_time, kv_capacity, kv_transfer_time,
                                 prefill_time)
from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.queueing import batch_ttft, mg1_wait
from pipeline.plan.units import GIB
from pipeline.plan.workload import Workload


@dataclass
class Prediction:
    """Predicted steady state of one pool configuration. Times in seconds, rates in requests/s,
    bytes in bytes; utilisations are fractions (1 = saturated).

    ``decode_workers`` is 0 when colocated (``prefill_workers`` then counts the colocated
    workers). ``throughput`` is the arrival rate served, or for a batch ``count / makespan``.
    ``queue_wait_s`` is the mean wait for a prefill worker (a batch: ``ttft_s`` less the prefill
    and hand-off); ``ttft_s`` adds the prefill (and hand-off); ``ttft_p50_s`` is the median TTFT
    of a batch (``None`` with a rate). ``rows_in_flight`` is the batch's rows in flight per
    prefill (or colocated) worker (``None``: unbounded).
    ``running`` is the concurrency per decode (or colocated) worker; ``itl_s`` the mean
    inter-token gap, ``itl_worst_s`` the longest (colocated: one p99 prefill inside a gap);
    ``stall_fraction`` the share of a colocated worker's gaps that hold a prefill.
    ``makespan_s`` is set when the workload has a count. ``prefill_tp`` / ``decode_tp``: devices
    per prefill (or colocated) / decode worker (a colocated pool's ``decode_tp`` equals its
    ``prefill_tp``, the pipeline's ``model.prefill_tp``).
    """

    mode: str
    prefill_workers: int
    decode_workers: int
    prefill_tp: int
    decode_tp: int
    throughput: float
    prefill_s: float
    prefill_p99_s: float
    kv_bytes: float
    kv_transfer_s: float
    prefill_util: float
    queue_wait_s: float
    ttft_s: float
    running: float
    itl_s: float
    itl_worst_s: float
    decode_util: float
    stall_fraction: float
    output_tokens_per_s: float
    makespan_s: float | None = None
    ttft_p50_s: float | None = None
    rows_in_flight: int | None = None

    @property
    def devices(self) -> int:
        """Devices of the configuration: ``x prefill_tp + y decode_tp`` (colocated: ``w prefill_tp``)."""
        return self.prefill_workers * self.prefill_tp + self.decode_workers * self.decode_tp

    @property
    def overrides(self) -> str:
        """Hydra overrides that run this configuration."""
        if self.mode == "colocated":
            out = f"pools=colocated pools.prefill={self.prefill_workers}"
        else:
            out = f"pools=disaggregated pools.prefill={self.prefill_workers} pools.decode={self.decode_workers}"
        if self.prefill_tp > 1:
            out += f" model.prefill_tp={self.prefill_tp}"
        if self.mode != "colocated" and self.decode_tp > 1:
            out += f" model.decode_tp={self.decode_tp}"
        return out


@dataclass
class PrefillSide:
    """A workload's prefill on one worker: each prompt's service time, their mean, the p99
    prompt's, the mean prompt's KV bytes, the seconds to move them (``transfer_s``, what loads
    the link) and the hand-off's latency (``handoff_s`` = ``transfer_s`` + the hardware's fixed
    ``handoff_s``: prefill end to first token)."""

    services: list[float]
    mean_s: float
    p99_s: float
    kv_bytes: float
    transfer_s: float
    handoff_s: float


def prefill_side(model: ModelShape, hw: Hardware, wl: Workload, tp: int, decode_tp: int | None = None) -> PrefillSide:
    """The :class:`PrefillSide` of ``wl`` on a worker of ``tp`` devices handing off to decode
    workers of ``decode_tp`` (default ``tp``). The KV moves over ``min(tp, decode_tp)`` links:
    with different TP sizes each device of the smaller pool exchanges its KV heads with
    ``tp_ratio`` devices of the larger one (vLLM's NIXL connector, ``TransferTopology``), so its
    one link carries its whole share."""
    services = [prefill_time(model, hw, p, tp) for p in wl.prompt_tokens]
    kv = model.kv_bytes_per_token * wl.mean_prompt
    transfer = kv_transfer_time(kv, hw, min(tp, decode_tp or tp))
    return PrefillSide(services, sum(services) / len(services), prefill_time(model, hw, wl.p99_prompt, tp),
                       kv, transfer, transfer + hw.handoff_s)


def decode_worker_util(model: ModelShape, hw: Hardware, wl: Workload, running: float, tp: int) -> float:
    """Utilisation of a worker decoding ``running`` sequences: the larger of its share of the
    max batch and of its KV capacity."""
    cap = kv_capacity(model, hw, tp)
    kv_util = running * model.kv_bytes_per_token * wl.decode_context / cap if cap > 0 else math.inf
    return max(running / hw.max_batch, kv_util)


def _max_running(model: ModelShape, hw: Hardware, wl: Workload, tp: int) -> float:
    """Most sequences one worker can run: max batch and KV capacity."""
    cap = kv_capacity(model, hw, tp)
    return max(0.0, min(hw.max_batch, cap / (model.kv_bytes_per_token * wl.decode_context)))


def fewest_workers(util_at, target: float, start: int = 1, limit: int = 100_000) -> int | None:
    """Smallest worker count ``w >= start`` with ``util_at(w) <= target``."""
    for w in range(start, limit):
        if util_at(w) <= target:
            return w
    return None


def predict(model: ModelShape, hw: Hardware, wl: Workload, mode: str = "disaggregated",
            prefill: int = 1, decode: int = 1, tp: int | None = None,
            rows_in_flight: int | None = None, *, prefill_tp: int | None = None,
            decode_tp: int | None = None) -> Prediction:
    """Predict one configuration: ``mode="disaggregated"`` with ``prefill`` x ``decode`` workers,
    or ``mode="colocated"`` with ``prefill`` workers (the pipeline's ``pools.prefill``); ``tp``
    devices per worker (default :func:`~pipeline.plan.costs.auto_tp`), or each pool its own:
    ``prefill_tp`` (prefill and colocated workers: prefill FLOP/s scale with it) and
    ``decode_tp`` (memory bandwidth and FLOP/s of a decode worker scale with it, and its KV
    capacity on a device profile; a CPU profile's KV space is fixed),
    each defaulting to ``tp``; ``rows_in_flight`` per prefill (or colocated) worker, for a batch
    (default: unbounded).

    With a rate: the steady state at that rate (M/G/1 prefill queue, Little's-law decode
    concurrency; see :mod:`pipeline.plan`); ``makespan_s = (count - 1) / rate + TTFT + E[o] x
    ITL`` when the workload has a count.

    Without (a batch of ``count`` requests, all there at the start, run as fast as the pools
    allow; no queueing model, prefill utilisation = prefill busy time / makespan). Each prefill
    (or colocated) worker serves ``m = count / x`` requests and keeps ``b = min(rows_in_flight,
    m)`` of them in flight (the pipeline's ``job.batch_rows``: a row holds its place from
    entering prefill to its last token; ``None``: ``b = m``). ``S = E[S]``, ``S' = max(S, T)``
    (the engine's spacing), ``H`` the hand-off (``T`` + the hardware's ``handoff_s``):

    - disaggregated: decode runs ``n = min(n_max, count / y, x b / y)`` sequences, busy ``D =
      E[o] x ITL(n) x max(1, count / (y n))``; a request decodes for ``Dr = E[o] x ITL_ss``, at
      the steady concurrency of Little's law (prefill feeding each decode worker ``x / S' / y``
      requests/s, at most ``n``). Makespan = the largest of: prefill-bound ``m S' + H + Dr``
      (the last request still hands off and decodes after its prefill); decode-bound ``S + H +
      D`` (decoding starts after the first prefill); and rows-in-flight-bound ``j S' + k (S + H
      + Dr) + H + Dr``, the last request being the ``j``-th of the ``k+1``-th wave of ``b``
      (``k = ceil(m / b) - 1``, ``j = ceil(m) - k b``: each wave enters as the one before
      finishes). TTFT: :func:`~pipeline.plan.queueing.batch_ttft` (the first ``b`` requests
      queue for the engine, later ones wait ``b / X - Dr`` by the response time law) with the
      steady throughput per prefill worker ``X = min(1 / S', b / (S + H + Dr), y n / (x E[o]
      ITL(n)))`` (prefill, the rows in flight, decode: the asymptotic bounds of a closed system,
      Lazowska et al. 1984, ch. 5);
    - colocated: each worker prefills its ``m`` prompts and decodes them ``n = min(n_max, b)`` at
      a time: makespan ``= m S + E[o] x ITL(n) x max(1, m / n)``; TTFT by the same
      :func:`~pipeline.plan.queueing.batch_ttft` with no hand-off, ``X = min(1 / (S + E[o]
      ITL(n) / n), b / (S + Dr))``, ``Dr = E[o]`` x the stretched ITL;

    and ``throughput = count / makespan``. With ``b = m`` the mean TTFT is ``(m + 1) / 2 x S' +
    H``: the mean wait of a FIFO batch.

    Raises:
        ValueError: a pool is overloaded at the workload's rate (the message says how many
            workers it needs), a bad mode or worker count, or the KV cache of a worker cannot
            hold one request.
    """
    if mode not in ("disaggregated", "colocated"):
        raise ValueError(f"mode must be disaggregated or colocated, got {mode!r}")
    if prefill < 1 or (mode == "disaggregated" and decode < 1):
        raise ValueError(f"worker counts must be >= 1, got prefill={prefill} decode={decode}")
    if rows_in_flight is not None and rows_in_flight < 1:
        raise ValueError(f"rows in flight must be >= 1, got {rows_in_flight}")
    colocated = mode == "colocated"
    if not tp and not (prefill_tp and (colocated or decode_tp)):
        tp = auto_tp(model, hw)  # only where a pool's TP is left to it (it refuses models past 8 devices)
    ptp = prefill_tp or tp
    dtp = ptp if colocated else decode_tp or tp
    if ptp < 1 or dtp < 1:
        raise ValueError(f"TP sizes must be >= 1, got prefill {ptp}, decode {dtp}")
    n_max = _max_running(model, hw, wl, dtp)
    if n_max < 1:
        raise ValueError(f"{model.name}: the KV cache of one {'colocated' if colocated else 'decode'} worker "
                         f"({kv_capacity(model, hw, dtp) / GIB:.3g} GiB) holds less than one request; use more "
                         f"devices per worker (--tp, --decode-tp)")
    pf = prefill_side(model, hw, wl, ptp, dtp)
    args = (model, hw, wl, pf, prefill, decode, (ptp, dtp), n_max)
    if wl.rate is None:
        batch = _predict_batch_colocated if colocated else _predict_batch_disaggregated
        return batch(*args, rows_in_flight)
    return _predict_rate(*args, colocated)


def _predict_rate(model, hw, wl, pf, prefill, decode, tps, n_max, colocated) -> Prediction:
    (ptp, tp), rate, ctx, out = tps, wl.rate, wl.decode_context, wl.mean_output
    workers = prefill if colocated else decode
    per_request = pf.mean_s if colocated else max(pf.mean_s, pf.transfer_s)
    prefill_util = rate * per_request / prefill
    if prefill_util >= 1:
        need = math.floor(rate * per_request) + 1
        raise ValueError(f"{'colocated' if colocated else 'prefill'} pool overloaded: utilisation "
                         f"{prefill_util:.2f} >= 1 with {prefill} workers; it needs at least {need}")
    wait = mg1_wait(rate / prefill, pf.services)
    stretch = 1 / (1 - prefill_util) if colocated else 1.0

    def running_at(w: int) -> float:
        rho = rate * pf.mean_s / w if colocated else 0.0
        if rho >= 1:
            return math.inf
        try:
            return decode_concurrency(model, hw, rate / w, out, ctx, tp, 1 / (1 - rho))[0]
        except ValueError:
            return math.inf

    n = running_at(workers)
    if n > n_max:
        need = fewest_workers(lambda w: running_at(w) / n_max, 1.0, workers + 1)
        raise ValueError(f"{'colocated' if colocated else 'decode'} pool overloaded: {rate:.3g} requests/s "
                         f"need more than the {n_max:.0f} sequences each of {workers} workers can run; "
                         f"it needs at least {need}")
    step = decode_step_time(model, hw, n, ctx, tp)
    itl = step * stretch
    decode_util = decode_worker_util(model, hw, wl, n, tp)
    if not colocated:
        decode_util = max(decode_util, rate * pf.transfer_s / decode)
    ttft = wait + pf.mean_s + (0.0 if colocated else pf.handoff_s)
    makespan = (wl.count - 1) / rate + ttft + out * itl if wl.count is not None else None
    return Prediction(
        mode="colocated" if colocated else "disaggregated", prefill_workers=prefill,
        decode_workers=0 if colocated else decode, prefill_tp=ptp, decode_tp=tp, throughput=rate, prefill_s=pf.mean_s,
        prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=0.0 if colocated else pf.transfer_s,
        prefill_util=prefill_util, queue_wait_s=wait, ttft_s=ttft, running=n, itl_s=itl,
        itl_worst_s=step + pf.p99_s if colocated else step, decode_util=decode_util,
        stall_fraction=min(1.0, rate / prefill * itl) if colocated else 0.0,
        output_tokens_per_s=rate * out, makespan_s=makespan)


def _predict_batch_disaggregated(model, hw, wl, pf, x, y, tps, n_max, rows_in_flight) -> Prediction:
    (ptp, tp), count, ctx, out = tps, wl.count, wl.decode_context, wl.mean_output
    s, h = pf.mean_s, pf.handoff_s
    spacing = max(pf.mean_s, pf.transfer_s)
    m = count / x
    b = min(rows_in_flight or m, m)
    busy_p = m * spacing
    n = min(n_max, count / y, x * b / y)
    step_n = decode_step_time(model, hw, n, ctx, tp)
    busy_d = out * step_n * max(1.0, count / (y * n))
    # steady concurrency while prefill feeds decode at x / S' (capped by the pool, batch and rows in flight)
    try:
        n_ss = min(n, decode_concurrency(model, hw, x / spacing / y, out, ctx, tp)[0])
    except ValueError:
        n_ss = n
    itl = decode_step_time(model, hw, n_ss, ctx, tp)
    dr = out * itl
    k = math.ceil(m / b - 1e-9) - 1
    last = math.ceil(m - 1e-9) - k * b
    makespan = max(busy_p + h + dr, s + h + busy_d, last * spacing + k * (s + h + dr) + h + dr)
    rate = count / makespan
    steady = min(1 / spacing, b / (s + h + dr), y * n / (x * out * step_n))
    ttft, ttft_p50 = batch_ttft(math.ceil(m - 1e-9), math.ceil(b - 1e-9), spacing, h, dr, steady)
    return Prediction(
        mode="disaggregated", prefill_workers=x, decode_workers=y, prefill_tp=ptp, decode_tp=tp, throughput=rate,
        prefill_s=pf.mean_s, prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=pf.transfer_s,
        prefill_util=busy_p / makespan, queue_wait_s=ttft - s - h, ttft_s=ttft, running=n_ss,
        itl_s=itl, itl_worst_s=itl,
        decode_util=max(decode_worker_util(model, hw, wl, n_ss, tp), busy_d / makespan),
        stall_fraction=0.0, output_tokens_per_s=rate * out, makespan_s=makespan, ttft_p50_s=ttft_p50,
        rows_in_flight=rows_in_flight)


def _predict_batch_colocated(model, hw, wl, pf, w, _decode, tps, n_max, rows_in_flight) -> Prediction:
    (_, tp), count, ctx, out = tps, wl.count, wl.decode_context, wl.mean_output
    per_worker = count / w
    b = min(rows_in_flight or per_worker, per_worker)
    n = min(n_max, b)
    step = decode_step_time(model, hw, n, ctx, tp)
    busy_p = per_worker * pf.mean_s
    busy_d = out * step * max(1.0, per_worker / n)
    makespan = busy_p + busy_d
    rate = count / makespan
    rho = busy_p / makespan
    itl = step / (1 - rho)
    steady = min(1 / (pf.mean_s + out * step / n), b / (pf.mean_s + out * itl))
    ttft, ttft_p50 = batch_ttft(math.ceil(per_worker - 1e-9), math.ceil(b - 1e-9), pf.mean_s, 0.0, out * itl, steady)
    return Prediction(
        mode="colocated", prefill_workers=w, decode_workers=0, prefill_tp=tp, decode_tp=tp, throughput=rate,
        prefill_s=pf.mean_s, prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=0.0,
        prefill_util=rho, queue_wait_s=ttft - pf.mean_s, ttft_s=ttft, running=n, itl_s=itl,
        itl_worst_s=step + pf.p99_s, decode_util=decode_worker_util(model, hw, wl, n, tp),
        stall_fraction=min(1.0, rate / w * itl), output_tokens_per_s=rate * out, makespan_s=makespan,
        ttft_p50_s=ttft_p50, rows_in_flight=rows_in_flight)
