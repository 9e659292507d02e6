"""What can go wrong between a row and its generation, by who must act: a row error (the row
becomes an error row and the shard goes on) or a worker failure (the worker stops; its restart
serves the row again)."""

from __future__ import annotations


class DecodeUnavailable(RuntimeError):
    """No decode worker published its endpoint (or stayed alive) in time: a worker failure."""


class DecodeLost(RuntimeError):
    """The decode worker holding a hand-off died or was restarted; the row must be served again."""


class DecodeUnreachable(DecodeLost):
    """A decode worker did not acknowledge a hand-off within ``transport.ack_timeout_s``: the link
    to it is down (cut, or its packets dropped) though its heartbeat goes on. The row is served
    again on another decode worker."""


class KVTooLarge(ValueError):
    """A request's KV (prompt + new tokens) exceeds the KV cache of every decode worker: no
    worker could ever hold it, so it must not be handed off (it would wait forever)."""


def check_fits(capacity: dict[int, int | None], dram_capacity: dict[int, int | None], kv_tokens: int,
               prompt_tokens: int | None = None) -> None:
    """Raise :class:`KVTooLarge` if no decode worker of known size (``capacity``: rank -> tokens
    its KV cache holds) holds ``kv_tokens`` tokens, or (given ``prompt_tokens``, with the DRAM
    tier: ``dram_capacity``) no worker's DRAM tier holds the prompt's KV (nothing is known before
    the first worker publishes its capacity)."""
    known = [c for c in capacity.values() if c]
    if known and kv_tokens > max(known):
        raise KVTooLarge(
            f"the request needs KV for {kv_tokens} tokens (prompt + max new tokens) but the largest "
            f"decode worker's KV cache holds {max(known)} tokens; shorten the prompt, lower "
            f"job.sampling.max_new_tokens, or give decode more KV cache (model.kv_cache_gib)")
    dram = [c for c in dram_capacity.values() if c]
    if prompt_tokens is not None and dram and prompt_tokens > max(dram):
        raise KVTooLarge(
            f"the prompt's KV ({prompt_tokens} tokens) exceeds the largest decode worker's DRAM tier "
            f"({max(dram)} tokens); raise offload.dram_gib")


def is_worker_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means this worker cannot go on (its engine died, no decode worker is left),
    as opposed to one row failing. Such an error must not be written down as a row's result: the
    worker fails, and its restart serves the row again."""
    return isinstance(exc, DecodeUnavailable) or type(exc).__name__ == "EngineDeadError"
