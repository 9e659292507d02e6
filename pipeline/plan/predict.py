"""Predict one pool configuration: :class:`Prediction` of a disaggregated xP:yD or a colocated
pool, at a rate (steady state) or for a batch (makespan)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.plan.costs import (auto_tp, decode_concurrency, decode_step_time, kv_capacity, kv_transfer_time,
                                 prefill_time)
from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.queueing import mg1_wait
from pipeline.plan.units import GIB
from pipeline.plan.workload import Workload


@dataclass
class Prediction:
    """Predicted steady state of one pool configuration. Times in seconds, rates in requests/s,
    bytes in bytes; utilisations are fractions (1 = saturated).

    ``decode_workers`` is 0 when colocated (``prefill_workers`` then counts the colocated
    workers). ``throughput`` is the arrival rate served, or for a batch ``count / makespan``.
    ``queue_wait_s`` is the mean wait for a prefill worker (a batch: the mean wait of a FIFO
    batch, ``(count / workers - 1) / 2 x E[S]``); ``ttft_s`` adds the prefill (and hand-off).
    ``running`` is the concurrency per decode (or colocated) worker; ``itl_s`` the mean
    inter-token gap, ``itl_worst_s`` the longest (colocated: one p99 prefill inside a gap);
    ``stall_fraction`` the share of a colocated worker's gaps that hold a prefill.
    ``makespan_s`` is set when the workload has a count.
    """

    mode: str
    prefill_workers: int
    decode_workers: int
    tp: int
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

    @property
    def overrides(self) -> str:
        """Hydra overrides that run this configuration."""
        if self.mode == "colocated":
            out = f"pools=colocated pools.prefill={self.prefill_workers}"
        else:
            out = f"pools=disaggregated pools.prefill={self.prefill_workers} pools.decode={self.decode_workers}"
        if self.tp > 1:
            out += f" model.prefill_tp={self.tp} model.decode_tp={self.tp}"
        return out


@dataclass
class PrefillSide:
    """A workload's prefill on one worker: each prompt's service time, their mean, the p99
    prompt's, the mean prompt's KV bytes and the seconds to hand them off."""

    services: list[float]
    mean_s: float
    p99_s: float
    kv_bytes: float
    transfer_s: float


def prefill_side(model: ModelShape, hw: Hardware, wl: Workload, tp: int) -> PrefillSide:
    """The :class:`PrefillSide` of ``wl`` on a worker of ``tp`` devices."""
    services = [prefill_time(model, hw, p, tp) for p in wl.prompt_tokens]
    kv = model.kv_bytes_per_token * wl.mean_prompt
    return PrefillSide(services, sum(services) / len(services), prefill_time(model, hw, wl.p99_prompt, tp),
                       kv, kv_transfer_time(kv, hw, tp))


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
            prefill: int = 1, decode: int = 1, tp: int | None = None) -> Prediction:
    """Predict one configuration: ``mode="disaggregated"`` with ``prefill`` x ``decode`` workers,
    or ``mode="colocated"`` with ``prefill`` workers (the pipeline's ``pools.prefill``); ``tp``
    devices per worker (default :func:`~pipeline.plan.costs.auto_tp`).

    With a rate: the steady state at that rate (M/G/1 prefill queue, Little's-law decode
    concurrency; see :mod:`pipeline.plan`); ``makespan_s = (count - 1) / rate + TTFT + E[o] x
    ITL`` when the workload has a count.

    Without (a batch of ``count`` requests, all there at the start, run as fast as the pools
    allow; no queueing model, prefill utilisation = prefill busy time / makespan):

    - disaggregated: prefill busy ``P = count x max(E[S], T) / x``; decode runs ``n =
      min(n_max, count / y)`` sequences, busy ``D = E[o] x ITL(n) x max(1, count / (y n))``;
      makespan ``= max(P + T + E[o] x ITL_ss, E[S] + T + D)`` (prefill-bound: the last request
      still decodes after its prefill, at the steady concurrency ``ITL_ss`` of Little's law;
      decode-bound: decoding starts after the first prefill);
    - colocated: each worker prefills ``count / w`` prompts and decodes them ``n = min(n_max,
      count / w)`` at a time: makespan ``= (count / w) x E[S] + E[o] x ITL(n) x max(1, count /
      (w n))``;

    and ``throughput = count / makespan``.

    Raises:
        ValueError: a pool is overloaded at the workload's rate (the message says how many
            workers it needs), a bad mode or worker count, or the KV cache of a worker cannot
            hold one request.
    """
    if mode not in ("disaggregated", "colocated"):
        raise ValueError(f"mode must be disaggregated or colocated, got {mode!r}")
    if prefill < 1 or (mode == "disaggregated" and decode < 1):
        raise ValueError(f"worker counts must be >= 1, got prefill={prefill} decode={decode}")
    tp = tp or auto_tp(model, hw)
    n_max = _max_running(model, hw, wl, tp)
    if n_max < 1:
        raise ValueError(f"{model.name}: the KV cache of one worker ({kv_capacity(model, hw, tp) / GIB:.3g} GiB) "
                         f"holds less than one request; use more devices per worker (--tp)")
    pf = prefill_side(model, hw, wl, tp)
    colocated = mode == "colocated"
    args = (model, hw, wl, pf, prefill, decode, tp, n_max)
    if wl.rate is None:
        return _predict_batch_colocated(*args) if colocated else _predict_batch_disaggregated(*args)
    return _predict_rate(*args, colocated)


def _predict_rate(model, hw, wl, pf, prefill, decode, tp, n_max, colocated) -> Prediction:
    rate, ctx, out = wl.rate, wl.decode_context, wl.mean_output
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
    ttft = wait + pf.mean_s + (0.0 if colocated else pf.transfer_s)
    makespan = (wl.count - 1) / rate + ttft + out * itl if wl.count is not None else None
    return Prediction(
        mode="colocated" if colocated else "disaggregated", prefill_workers=prefill,
        decode_workers=0 if colocated else decode, tp=tp, throughput=rate, prefill_s=pf.mean_s,
        prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=0.0 if colocated else pf.transfer_s,
        prefill_util=prefill_util, queue_wait_s=wait, ttft_s=ttft, running=n, itl_s=itl,
        itl_worst_s=step + pf.p99_s if colocated else step, decode_util=decode_util,
        stall_fraction=min(1.0, rate / prefill * itl) if colocated else 0.0,
        output_tokens_per_s=rate * out, makespan_s=makespan)


def _predict_batch_disaggregated(model, hw, wl, pf, x, y, tp, n_max) -> Prediction:
    count, ctx, out = wl.count, wl.decode_context, wl.mean_output
    busy_p = count * max(pf.mean_s, pf.transfer_s) / x
    n = min(n_max, count / y)
    busy_d = out * decode_step_time(model, hw, n, ctx, tp) * max(1.0, count / (y * n))
    # steady concurrency while prefill feeds decode at x / E[S] (capped by the pool and the batch)
    feed = x / max(pf.mean_s, pf.transfer_s) / y
    try:
        n_ss = min(n, decode_concurrency(model, hw, feed, out, ctx, tp)[0])
    except ValueError:
        n_ss = n
    itl = decode_step_time(model, hw, n_ss, ctx, tp)
    makespan = max(busy_p + pf.transfer_s + out * itl, pf.mean_s + pf.transfer_s + busy_d)
    rate = count / makespan
    wait = (count / x - 1) / 2 * max(pf.mean_s, pf.transfer_s)  # mean wait of a FIFO batch
    return Prediction(
        mode="disaggregated", prefill_workers=x, decode_workers=y, tp=tp, throughput=rate,
        prefill_s=pf.mean_s, prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=pf.transfer_s,
        prefill_util=busy_p / makespan, queue_wait_s=wait, ttft_s=wait + pf.mean_s + pf.transfer_s, running=n_ss,
        itl_s=itl, itl_worst_s=itl,
        decode_util=max(decode_worker_util(model, hw, wl, n_ss, tp), busy_d / makespan),
        stall_fraction=0.0, output_tokens_per_s=rate * out, makespan_s=makespan)


def _predict_batch_colocated(model, hw, wl, pf, w, _decode, tp, n_max) -> Prediction:
    count, ctx, out = wl.count, wl.decode_context, wl.mean_output
    per_worker = count / w
    n = min(n_max, per_worker)
    step = decode_step_time(model, hw, n, ctx, tp)
    busy_p = per_worker * pf.mean_s
    busy_d = out * step * max(1.0, per_worker / n)
    makespan = busy_p + busy_d
    rate = count / makespan
    rho = busy_p / makespan
    itl = step / (1 - rho)
    wait = (per_worker - 1) / 2 * pf.mean_s  # mean wait of a FIFO batch (prefills go first)
    return Prediction(
        mode="colocated", prefill_workers=w, decode_workers=0, tp=tp, throughput=rate,
        prefill_s=pf.mean_s, prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=0.0,
        prefill_util=rho, queue_wait_s=wait, ttft_s=wait + pf.mean_s, running=n, itl_s=itl,
        itl_worst_s=step + pf.p99_s, decode_util=decode_worker_util(model, hw, wl, n, tp),
        stall_fraction=min(1.0, rate / w * itl), output_tokens_per_s=rate * out, makespan_s=makespan)
