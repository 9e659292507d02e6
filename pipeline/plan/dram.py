"""The decode host-DRAM KV tier: how much host DRAM a decode worker and node need to stage and
swap the KV of a disaggregated split (:class:`DramTier`, :func:`dram_tier`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.plan.costs import decode_concurrency, decode_step_time, host_load_time, kv_capacity
from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.predict import Prediction, fewest_workers
from pipeline.plan.queueing import dram_full_probability, erlang_c
from pipeline.plan.units import GIB
from pipeline.plan.workload import Workload


def node_dram(hw: Hardware) -> float:
    """Host DRAM of one node, bytes: ``hw.node_dram_bytes``, else this machine's ``MemTotal``
    from ``/proc/meminfo`` (kB = 1024 bytes there).

    Raises:
        ValueError: neither is available.
    """
    if hw.node_dram_bytes is not None:
        return hw.node_dram_bytes
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    raise ValueError(f"hardware {hw.name}: no node DRAM size and no /proc/meminfo; give --node-dram GiB")


@dataclass
class DramTier:
    """Host DRAM a decode worker and node need for the KV tier of one disaggregated split (see
    :func:`dram_tier` for the formulas). Bytes in bytes, times in seconds, rates in requests/s;
    counts of requests are per decode worker unless named ``node``.

    ``request_bytes`` is the KV of a whole request (prompt + generated tokens: what a KV-cache
    slot holds), ``load_bytes`` of its prompt: what it holds in DRAM, pushed there and loaded
    from there. ``slots``: sequences one worker's KV cache holds at full length; ``admitted``:
    at prompt length (what vLLM admits); ``swapped = admitted - slots`` the most it may preempt
    (they come back from DRAM). ``rate`` is per decode worker (a batch: while prefill runs);
    ``residence_s`` a request's time in a slot, ``offered`` ``rate x residence_s`` (erlangs),
    ``wait_probability`` the Erlang C probability of waiting (``None`` for a batch),
    ``admit_wait_s`` the mean wait for a slot. ``hold_s``: how long a request holds its DRAM
    slots, from their reservation before its prefill to the end of its decode. ``upstream``
    (reserved, queued for or in prefill or being pushed), ``waiting`` (for a slot) and
    ``decoding`` (in a slot) add up to ``staged``, the requests holding DRAM (a rate: means; a
    batch: the rows in flight, ``in_flight``); ``sized_requests`` = ``ceil(headroom x staged)``.
    ``full_probability``: chance a reservation finds that many there; ``sized_1pct``: the fewest
    requests that bring it to 1% or less (``None`` for a batch). ``prefill_hold_s``: how long
    the prefill worker keeps a request's KV after its prefill (until its write into the tier
    completes). ``load_steps`` = ``load_s / itl_s``; ``blocking_itl_s`` = ``itl_s + load_s``,
    the gap the running sequences see if a load is not overlapped with decoding; ``ttft_s`` =
    the split's TTFT (``split_ttft_s``) + ``admit_wait_s`` + ``load_s``; ``h2d_util`` = ``rate
    x load_s``, the share of time a device's host link spends on loads.
    """

    prefill_workers: int
    decode_workers: int
    tp: int
    workers_per_node: int
    decode_nodes: int
    headroom: float
    request_bytes: float
    load_bytes: float
    kv_capacity_bytes: float
    slots: int
    admitted: int
    swapped: int
    rate: float
    itl_s: float
    transfer_s: float
    load_s: float
    residence_s: float
    offered: float
    wait_probability: float | None
    admit_wait_s: float
    hold_s: float
    upstream: float
    waiting: float
    decoding: float
    staged: float
    in_flight: float | None
    sized_requests: int | None
    worker_bytes: float
    node_bytes: float
    node_dram_bytes: float
    fits: bool
    full_probability: float | None
    sized_1pct: int | None
    prefill_hold_s: float
    load_steps: float
    blocking_itl_s: float
    split_ttft_s: float
    ttft_s: float
    h2d_util: float
    itl_target_s: float
    notes: list[str] = field(default_factory=list)


def dram_tier(model: ModelShape, hw: Hardware, wl: Workload, pred: Prediction, *,
              headroom: float = 1.2, itl_target_s: float = 0.1) -> DramTier:
    """Size the decode workers' host-DRAM KV pool for the disaggregated configuration ``pred``
    (x prefill workers, y decode workers of ``tp`` = ``pred.decode_tp`` devices). ``k`` = KV bytes per token (``2 x layers x
    KV heads x head dim x bytes``, :mod:`pipeline.engine.kv_layout`), ``p`` / ``o`` the mean
    prompt / output tokens, ``C_kv`` = :func:`~pipeline.plan.costs.kv_capacity`.

    What the pipeline does (:mod:`pipeline.roles.handoff`, :mod:`pipeline.roles.decode`): a
    row's owner reserves slots for its prompt's KV (``k p`` bytes) in a decode worker's tier
    *before* the row's prefill; the prefill worker writes the KV there when the prefill ends
    (``T`` = :func:`~pipeline.plan.costs.kv_transfer_time`) and then frees its own blocks; the
    decode worker loads it into its KV cache when vLLM admits the request (``load = k p / (tp x
    h2d_bw)``, :func:`~pipeline.plan.costs.host_load_time`), and again after a preemption; the
    slots are released when the request's decode ends. So a request holds ``k p`` bytes of DRAM
    for ``hold = queue wait + prefill + T + Wq + W``.

    - Slots ``c = min(max_batch, floor(C_kv / (k (p + o))))``: sequences that run to the end
      without preemption. vLLM admits by prompt length, up to ``min(max_batch, floor(C_kv /
      (k p)))``; the difference is the most it preempts (``swapped``; their DRAM copy is what
      brings them back).
    - With a rate: each decode worker gets ``lambda = rate / y``; a request holds a slot for
      ``W = load + o x ITL`` (ITL of ``pred``), so ``a = lambda W`` slots are busy (Little's law
      ``L = lambda W``). Waiting for a slot is an M/M/c queue: ``Wq = C(c, a) W / (c - a)``
      (:func:`erlang_c`); exponential service overstates the wait of equal-length requests
      (about 2x for M/D/c, Allen-Cunneen), which errs towards more DRAM. Requests holding DRAM
      by Little's law: ``lambda x hold`` = ``lambda (queue + prefill + T)`` upstream ``+ lambda
      Wq`` waiting ``+ a`` decoding.
    - A batch (no rate): every row in flight holds its reservation, so a decode worker's tier
      holds ``in_flight = min(count, x x rows in flight per prefill worker) / y`` requests at
      the peak (``pred.rows_in_flight``, the pipeline's ``job.batch_rows``; unbounded: every
      row). Prefill delivers ``lambda = x / max(S, T) / y`` requests/s to each decode worker for
      ``P = count / (x / max(S, T))`` seconds, and a worker with all slots busy (ITL at ``c``
      sequences) completes ``mu = c / W``; those waiting for a slot peak at ``min(in_flight - c,
      max(0, lambda P - c - mu max(0, P - W)))`` (fluid), mean wait ``peak / (2 mu)``. With less
      DRAM than that the prefill waits for slots (back-pressure), which costs nothing while decode
      is the bottleneck (``lambda > mu``).
    - Sized: ``ceil(headroom x staged)`` requests (at least 1) per worker x ``k p``; per node
      ``min(y, node_devices // tp)`` workers; checked against :func:`node_dram`. Mean values: the
      headroom covers fluctuation, and ``full_probability`` says how often a reservation still
      finds the pool full (:func:`dram_full_probability`); ``sized_1pct`` is the fewest
      requests for which that is at most 1%.
    - The prefill worker holds a request's KV for ``prefill_hold_s = T`` after its prefill (the
      write; vLLM frees the blocks at the end of the engine step in which it completed).
    - The load adds ``load`` to TTFT (plus ``Wq``). Not overlapped with decoding it stalls the
      running sequences: one gap of ``ITL + load``, to compare with ``itl_target_s``.

    Raises:
        ValueError: ``pred`` is colocated, ``headroom < 1``, or a worker's KV cache holds less
            than one whole request.
    """
    _check_split(pred, headroom)
    tp, x, y = pred.decode_tp, pred.prefill_workers, pred.decode_workers
    k = model.kv_bytes_per_token
    p, o = wl.mean_prompt, wl.mean_output
    request_bytes, load_bytes = k * (p + o), k * p
    cap = kv_capacity(model, hw, tp)
    slots, admitted = _slots(model, hw, cap, request_bytes, load_bytes)
    load = host_load_time(load_bytes, hw, tp)
    transfer = pred.kv_transfer_s
    if wl.rate is not None:
        occ = _at_rate(model, hw, wl, pred, slots, load)
    else:
        occ = _in_batch(model, hw, wl, pred, slots, load)
    hold = pred.queue_wait_s + pred.prefill_s + transfer + occ.wait + occ.residence
    per_node = max(1, hw.node_devices // tp)
    on_node = min(y, per_node)
    dram = node_dram(hw)
    sized, worker_bytes = _sized(occ.staged, headroom, load_bytes)
    node_bytes = on_node * worker_bytes
    full, sized_1pct = _full_chances(wl, slots, occ, sized)
    fits = node_bytes <= dram
    notes = occ.notes + _node_note(fits, on_node, node_bytes, dram)
    return DramTier(
        prefill_workers=x, decode_workers=y, tp=tp, workers_per_node=per_node, decode_nodes=math.ceil(y / per_node),
        headroom=headroom, request_bytes=request_bytes, load_bytes=load_bytes, kv_capacity_bytes=cap,
        slots=slots, admitted=admitted, swapped=max(0, admitted - slots), rate=occ.lam, itl_s=occ.itl,
        transfer_s=transfer, load_s=load, residence_s=occ.residence, offered=occ.offered,
        wait_probability=occ.wait_p, admit_wait_s=occ.wait, hold_s=hold, upstream=occ.upstream,
        waiting=occ.waiting, decoding=occ.decoding, staged=occ.staged, in_flight=occ.in_flight,
        sized_requests=sized, worker_bytes=worker_bytes, node_bytes=node_bytes, node_dram_bytes=dram, fits=fits,
        full_probability=full, sized_1pct=sized_1pct, prefill_hold_s=transfer, load_steps=load / occ.itl,
        blocking_itl_s=occ.itl + load, split_ttft_s=pred.ttft_s, ttft_s=pred.ttft_s + occ.wait + load,
        h2d_util=occ.lam * load, itl_target_s=itl_target_s, notes=notes)


def _check_split(pred: Prediction, headroom: float) -> None:
    """Raises ValueError: ``pred`` is colocated, or ``headroom < 1``."""
    if pred.mode != "disaggregated":
        raise ValueError("the DRAM tier sits on decode workers: give a disaggregated prediction")
    if not headroom >= 1:
        raise ValueError(f"DRAM headroom must be >= 1, got {headroom}")


def _slots(model: ModelShape, hw: Hardware, cap: float, request_bytes: float, load_bytes: float) -> tuple[int, int]:
    """(sequences one worker's KV cache of ``cap`` bytes holds at full length, at prompt length).

    Raises:
        ValueError: it holds less than one whole request.
    """
    slots = int(min(hw.max_batch, math.floor(cap / request_bytes)))
    admitted = int(min(hw.max_batch, math.floor(cap / load_bytes)))
    if slots < 1:
        raise ValueError(f"{model.name}: the KV cache of one worker ({cap / GIB:.3g} GiB) holds less than one "
                         f"whole request ({request_bytes / GIB:.3g} GiB); use more devices per worker (--tp)")
    return slots, admitted


@dataclass
class _Occupancy:
    """Requests per decode worker and where they are (:class:`DramTier`'s fields of the same
    meaning: ``lam`` is ``rate``, ``wait`` is ``admit_wait_s``)."""

    lam: float
    itl: float
    residence: float
    offered: float
    wait_p: float | None
    wait: float
    upstream: float
    waiting: float
    decoding: float
    staged: float
    in_flight: float | None = None
    notes: list[str] = field(default_factory=list)


def _at_rate(model: ModelShape, hw: Hardware, wl: Workload, pred: Prediction, slots: int, load: float) -> _Occupancy:
    """Requests arriving at ``wl.rate``: an M/M/c queue for the slots, Little's law for the rest
    (see :func:`dram_tier`)."""
    lam = wl.rate / pred.decode_workers
    itl = pred.itl_s
    o = wl.mean_output
    residence = load + o * itl
    offered = lam * residence
    notes: list[str] = []
    if offered < slots:
        wait_p = erlang_c(slots, offered)
        wait = wait_p * residence / (slots - offered)
    else:
        wait_p, wait = 1.0, math.inf
        notes.append(_overload_note(model, hw, wl, pred, slots, load, offered))
    upstream = lam * (pred.queue_wait_s + pred.prefill_s + pred.kv_transfer_s)
    waiting = lam * wait
    decoding = min(offered, slots)
    return _Occupancy(lam, itl, residence, offered, wait_p, wait, upstream, waiting, decoding,
                      upstream + waiting + decoding, notes=notes)


def _overload_note(model: ModelShape, hw: Hardware, wl: Workload, pred: Prediction, slots: int, load: float,
                   offered: float) -> str:
    """Why a decode worker's admission cannot keep up, and the fewest decode workers that can."""
    o, tp = wl.mean_output, pred.decode_tp

    def busy(w: int) -> float:
        try:
            return wl.rate / w * (load + o * decode_concurrency(model, hw, wl.rate / w, o,
                                                                 wl.decode_context, tp)[1]) / slots
        except ValueError:
            return math.inf

    need = fewest_workers(busy, 1 - 1e-9, pred.decode_workers + 1)
    return (f"decode admission overloaded: {offered:.3g} of {slots} slots busy per worker, so the "
            f"DRAM backlog grows without bound; it needs at least {need} decode workers")


def _in_batch(model: ModelShape, hw: Hardware, wl: Workload, pred: Prediction, slots: int,
              load: float) -> _Occupancy:
    """A batch (no rate): every row in flight holds its reservation; those waiting for a slot
    as a fluid (see :func:`dram_tier`)."""
    x, y = pred.prefill_workers, pred.decode_workers
    feed = x / max(pred.prefill_s, pred.kv_transfer_s)
    lam = feed / y
    itl = decode_step_time(model, hw, slots, wl.decode_context, pred.decode_tp)
    residence = load + wl.mean_output * itl
    offered = lam * residence
    mu = slots / residence
    prefill_phase = wl.count / feed
    in_flight = min(wl.count, x * (pred.rows_in_flight or wl.count)) / y
    waiting = min(max(0.0, in_flight - slots),
                  max(0.0, lam * prefill_phase - slots - mu * max(0.0, prefill_phase - residence)))
    decoding = min(in_flight, slots)
    upstream = max(0.0, in_flight - decoding - waiting)
    notes = []
    if lam > mu:
        notes.append(f"batch: prefill delivers {lam:.3g} requests/s per decode worker, decode completes "
                     f"{mu:.3g}; the backlog peaks at the end of prefill. With less DRAM prefill waits "
                     f"for room, and the makespan does not change (decode is the bottleneck)")
    return _Occupancy(lam, itl, residence, offered, None, waiting / (2 * mu), upstream, waiting, decoding,
                      in_flight, in_flight=in_flight, notes=notes)


def _sized(staged: float, headroom: float, load_bytes: float) -> tuple[int | None, float]:
    """(requests one worker's pool is sized for, its bytes): ``ceil(headroom x staged)``, at
    least 1; (None, inf) when ``staged`` grows without bound."""
    if not math.isfinite(staged):
        return None, math.inf
    sized = max(1, math.ceil(headroom * staged - 1e-9))
    return sized, sized * load_bytes


def _full_chances(wl: Workload, slots: int, occ: _Occupancy, sized: int | None) -> tuple[float | None, int | None]:
    """(the chance a reservation finds ``sized`` requests' pool full, the fewest requests that
    bring it to 1%): None for a batch or an unbounded backlog."""
    if wl.rate is None or sized is None:
        return None, None
    full = dram_full_probability(slots, occ.offered, occ.upstream, sized)
    sized_1pct = next(m for m in range(1, sized + 100_000)
                      if dram_full_probability(slots, occ.offered, occ.upstream, m) <= 0.01)
    return full, sized_1pct


def _node_note(fits: bool, on_node: int, node_bytes: float, dram: float) -> list[str]:
    """A note when the decode workers' pools on one node exceed its DRAM (none when unbounded)."""
    if fits or not math.isfinite(node_bytes):
        return []
    return [f"the DRAM pools of {on_node} decode worker{'s' if on_node > 1 else ''} ({node_bytes / GIB:.4g} "
            f"GiB) exceed the node's {dram / GIB:.4g} GiB: fewer workers per node, more decode workers, "
            f"or less headroom"]
