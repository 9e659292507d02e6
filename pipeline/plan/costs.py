"""What a request costs a worker: prefill FLOPs and seconds, KV moves, the decode-step roofline
and its Little's-law concurrency, KV capacity and the tensor-parallel size (the formulas of
:mod:`pipeline.plan`)."""

from __future__ import annotations

from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.units import GB


def prefill_flops(model: ModelShape, tokens: float) -> float:
    """FLOPs to prefill a ``tokens``-token prompt: ``2 N L + 2 n_layer L^2 d_attn`` (Kaplan et al.
    2020, Table 1, summed over a causal prompt; see :mod:`pipeline.plan`)."""
    return 2 * model.flop_params * tokens + 2 * model.layers * tokens ** 2 * model.d_attn


def prefill_time(model: ModelShape, hw: Hardware, tokens: float, tp: int = 1) -> float:
    """Seconds to prefill ``tokens`` tokens on one worker of ``tp`` devices:
    ``prefill_flops / (tp x peak_flops x mfu)`` (compute bound)."""
    return prefill_flops(model, tokens) / (tp * hw.peak_flops * hw.mfu)


def kv_transfer_time(nbytes: float, hw: Hardware, tp: int = 1) -> float:
    """Seconds to move ``nbytes`` of KV from a prefill to a decode worker: ``nbytes / (tp x
    link_bw)`` (each of the ``tp`` devices sends its shard of the heads over its own link)."""
    return nbytes / (tp * hw.link_bw)


def host_load_time(nbytes: float, hw: Hardware, tp: int = 1) -> float:
    """Seconds to load ``nbytes`` of KV from host DRAM into a decode worker's KV cache:
    ``nbytes / (tp x h2d_bw)`` (each of the ``tp`` devices loads its share of the KV heads over
    its own host link; the same rule as :func:`kv_transfer_time`)."""
    return nbytes / (tp * hw.h2d_bw)


def decode_step_time(model: ModelShape, hw: Hardware, running: float, context: float, tp: int = 1) -> float:
    """Seconds of one decode step (the inter-token gap) of a worker running ``running``
    sequences of ``context`` tokens each: the roofline maximum of reading all weights plus every
    sequence's KV at ``tp x mem_bw x mbu`` and computing ``running x (2 (N + vocab x hidden) +
    4 n_layer context d_attn)`` FLOPs at ``tp x peak_flops x mfu`` (see :mod:`pipeline.plan`)."""
    (a_m, b_m), (a_c, b_c) = _step_lines(model, hw, context, tp)
    return max(a_m + b_m * running, a_c + b_c * running)


def _step_lines(model: ModelShape, hw: Hardware, context: float, tp: int) -> tuple[tuple[float, float], ...]:
    """The two roofline branches of a decode step as (seconds at 0 sequences, seconds per sequence)."""
    bw = tp * hw.mem_bw * hw.mbu
    flops = tp * hw.peak_flops * hw.mfu
    per_seq_flops = 2 * (model.flop_params + model.vocab * model.hidden) + 4 * model.layers * context * model.d_attn
    return ((model.weight_bytes / bw, model.kv_bytes_per_token * context / bw), (0.0, per_seq_flops / flops))


def decode_concurrency(model: ModelShape, hw: Hardware, rate: float, output_tokens: float,
                       context: float, tp: int = 1, stretch: float = 1.0) -> tuple[float, float]:
    """(running sequences, ITL seconds) of one decode worker fed ``rate`` requests/s of
    ``output_tokens`` tokens each: the fixed point of Little's law ``n = rate x output_tokens x
    stretch x step(n)`` with ``step`` = :func:`decode_step_time` (``stretch`` = ``1 / (1 -
    rho)`` stretches the gaps of a colocated worker that prefills a fraction rho of the time).
    Each branch ``a + b n`` of the roofline gives ``n = r a / (1 - r b)``, ``r = rate x
    output_tokens x stretch``; the fixed point is the larger. Returned ITL = ``step(n)``
    (without the stretch).

    Raises:
        ValueError: ``r b >= 1`` for a branch: the worker cannot keep up at any concurrency.
    """
    r = rate * output_tokens * stretch
    n = 0.0
    for a, b in _step_lines(model, hw, context, tp):
        if r * b >= 1:
            raise ValueError(f"decode worker overloaded: {rate:.3g} requests/s x {output_tokens:g} "
                             f"tokens need more than one worker's throughput")
        n = max(n, r * a / (1 - r * b))
    return n, decode_step_time(model, hw, n, context, tp)


def kv_capacity(model: ModelShape, hw: Hardware, tp: int = 1) -> float:
    """KV cache bytes of one worker: ``hw.kv_cache_bytes`` when fixed (CPU), else ``tp x memory
    x mem_fraction - weights``."""
    if hw.kv_cache_bytes is not None:
        return hw.kv_cache_bytes
    return tp * hw.memory_bytes * hw.mem_fraction - model.weight_bytes


def auto_tp(model: ModelShape, hw: Hardware) -> int:
    """Smallest tensor-parallel size in 1, 2, 4, 8 whose usable memory holds the weights twice
    over (half for weights, at least half for KV; a rule of thumb); 1 with a fixed KV space.

    Raises:
        ValueError: not even 8 devices hold the weights.
    """
    if hw.kv_cache_bytes is not None:
        return 1
    for tp in (1, 2, 4, 8):
        if model.weight_bytes <= 0.5 * tp * hw.memory_bytes * hw.mem_fraction:
            return tp
    raise ValueError(f"{model.name}: {model.weight_bytes / GB:.0f} GB of weights need more than 8 "
                     f"{hw.name} devices per worker")
