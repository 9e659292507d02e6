"""What an option costs: currency per million output tokens from device-hour prices
(``--device-hour-price``, ``--prefill-device-hour-price``, ``--decode-device-hour-price``).

The arithmetic (:func:`cost_per_million_tokens`) is the worked example of the practitioner article
"What Is Disaggregated Prefill and Decode? The Shift Reshaping AI Inference" (SIVARO), section
"The Economics": a single H100 node (one device) at 3.50/hour making 200 tokens/s costs
``3.50 / (200 x 3600) x 1e6 = 4.86`` per million tokens, and 2 prefill + 4 decode H100s, 6
GPUs at 10.50/hour together (1.75 per GPU-hour), making 1,100 tokens/s cost ``10.50 / (1,100 x
3600) x 1e6 = 2.65``. The price in that formula is the hourly price of the whole deployment; a
device-hour price becomes one by :func:`hourly_price` (devices x price per device-hour).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.plan.predict import Prediction


def hourly_price(devices: int, device_hour_price: float) -> float:
    """Hourly price (currency per hour) of ``devices`` devices at ``device_hour_price`` currency
    per device-hour each: ``devices x device_hour_price`` (the article's second example: 6 GPUs x
    1.75 per GPU-hour = 10.50 per hour)."""
    return devices * device_hour_price


def cost_per_million_tokens(deployment_price_per_hour: float, tokens_per_s: float) -> float:
    """Currency per million tokens of a deployment that costs ``deployment_price_per_hour``
    (currency per hour, all its devices together, not per device) and makes ``tokens_per_s``
    tokens per second: ``price per hour / (tokens/s x 3600 s/hour) x 1e6``.

    Source: the practitioner article's worked example (see :mod:`pipeline.plan.price`): 3.50/hour
    at 200 tokens/s gives 4.86 per million; 10.50/hour (6 GPUs) at 1,100 tokens/s gives 2.65.

    Raises:
        ValueError: ``tokens_per_s <= 0`` or a negative price.
    """
    if not tokens_per_s > 0:
        raise ValueError(f"tokens per second must be > 0, got {tokens_per_s}")
    if deployment_price_per_hour < 0:
        raise ValueError(f"price per hour must be >= 0, got {deployment_price_per_hour}")
    return deployment_price_per_hour / (tokens_per_s * 3600) * 1e6


@dataclass(frozen=True)
class OptionCost:
    """The price of one option of a plan: its devices (``prefill_devices`` + ``decode_devices``;
    a colocated pool counts all its devices as ``prefill_devices``, the pipeline's
    ``pools.prefill``), their price per hour (currency), the output tokens/s the plan predicts
    for it, and currency per million output tokens (:func:`cost_per_million_tokens`)."""

    option: str
    prefill_devices: int
    decode_devices: int
    price_per_hour: float
    output_tokens_per_s: float
    per_million_output_tokens: float


def option_cost(pred: Prediction, prefill_price: float | None, decode_price: float | None) -> OptionCost | None:
    """The :class:`OptionCost` of ``pred``: ``x prefill_tp`` devices at ``prefill_price`` plus
    ``y decode_tp`` at ``decode_price`` (currency per device-hour; each pool's devices, its
    workers times its TP size; a colocated pool: its ``w prefill_tp`` devices at
    ``prefill_price``, the caller passes the general price). ``None`` when a needed price is
    missing.

    Raises:
        ValueError: a price below 0, or no output tokens/s.
    """
    for p in (prefill_price, decode_price):
        if p is not None and p < 0:
            raise ValueError(f"device-hour price must be >= 0, got {p}")
    x, y = pred.prefill_workers * pred.prefill_tp, pred.decode_workers * pred.decode_tp
    if prefill_price is None or (y and decode_price is None):
        return None
    per_hour = hourly_price(x, prefill_price) + (hourly_price(y, decode_price) if y else 0.0)
    name = (f"disaggregated {pred.prefill_workers}P:{pred.decode_workers}D" if pred.decode_workers
            else f"colocated x{pred.prefill_workers}")
    return OptionCost(name, x, y, per_hour, pred.output_tokens_per_s,
                      cost_per_million_tokens(per_hour, pred.output_tokens_per_s))


def option_costs(options: list[Prediction | None], device_hour_price: float | None,
                 prefill_price: float | None = None, decode_price: float | None = None) -> list[OptionCost]:
    """The :class:`OptionCost` of each option a plan compares (``None`` options skipped): a
    disaggregated one at ``prefill_price`` and ``decode_price`` per device-hour, each defaulting
    to ``device_hour_price``; a colocated one at ``device_hour_price``. Options whose price is
    not given are left out (so no price at all gives ``[]``)."""
    out = []
    for pred in options:
        if pred is None:
            continue
        if pred.decode_workers:
            cost = option_cost(pred, device_hour_price if prefill_price is None else prefill_price,
                               device_hour_price if decode_price is None else decode_price)
        else:
            cost = option_cost(pred, device_hour_price, None)
        if cost is not None:
            out.append(cost)
    return out
