"""Did the KV move? Per row, the prompt tokens its decode worker computed itself, and a run's
counts of them.

A row handed off with its KV (prefill on a prefill worker, hand-off over NIXL or the DRAM tier)
reaches its decode worker with ``prompt_tokens`` tokens of prompt, of which ``kv_tokens``
arrived as KV (vLLM's ``num_cached_tokens`` on decode; local prefix-cache hits count too: they
were not computed either). The decode worker computes the rest: ``prompt_tokens - kv_tokens``.
vLLM's pull connector and the DRAM tier's leave the last prompt token to decode, whose logits
give the first output token (1 computed; push reports the whole prompt received: 0), so at most
1 is normal (:data:`NORMAL_COMPUTED`); more means the KV did not arrive and decode recomputed the prompt, a request that succeeds all the same (the
failure public reports of P/D stacks share: kserve #5987, vLLM #26896, LMCache #1547).
``transport.on_recompute`` decides whether such a row is served (``warn``) or an error row
(``fail``, :func:`recompute_error`).

A row prefilled on decode on purpose (a prompt under ``pools.local_prefill_tokens``, handed off
without KV) is counted apart: decode computes its whole prompt by design.
"""

from __future__ import annotations

from typing import Any, Iterable

#: Prompt tokens a decode worker computes at most for a row whose KV arrived whole: the last one.
NORMAL_COMPUTED = 1

#: How the error of a row failed by ``transport.on_recompute=fail`` starts.
ERROR_PREFIX = "decode recomputed "

#: The counts of :func:`kv_counts` (all 0 for a colocated run).
COUNT_KEYS = ("rows", "kv_loaded_rows", "recomputed_rows", "prompt_tokens", "computed_tokens",
              "recomputed_tokens", "local_rows", "local_tokens")


def computed_on_decode(prompt_tokens: int, kv_tokens: int) -> int:
    """Prompt tokens a decode worker computed itself for a row handed off with its KV (tokens;
    never negative)."""
    return max(0, prompt_tokens - kv_tokens)


def recompute_error(prompt_tokens: int, kv_tokens: int, on_recompute: str) -> str | None:
    """The error of a handed-off row whose decode worker recomputed its prompt, under
    ``transport.on_recompute`` (``warn`` or ``fail``): None when at most
    :data:`NORMAL_COMPUTED` tokens were computed, or with ``warn``."""
    computed = computed_on_decode(prompt_tokens, kv_tokens)
    if computed <= NORMAL_COMPUTED or on_recompute != "fail":
        return None
    return (f"{ERROR_PREFIX}{computed} of {prompt_tokens} prompt tokens (the KV did not arrive); "
            f"transport.on_recompute=fail")


def kv_counts(rows: Iterable[tuple[Any, Any, Any, Any, bool]]) -> dict[str, int]:
    """The counts of :data:`COUNT_KEYS` over rows given as ``(decode_worker, error,
    prompt_tokens, kv_tokens, handed_off)``: ``handed_off`` says the row was prefilled on a
    prefill worker and handed off with its KV (an output row: ``kv_handoff_s`` not null; a
    request metrics row: ``prefill_end`` not null); nulls count as 0 tokens.

    Counted: rows a decode worker served (``decode_worker`` not null) without an error, or
    whose error is :func:`recompute_error`'s. Of those handed off with their KV (``rows``, their
    ``prompt_tokens``): ``kv_loaded_rows`` (decode computed at most :data:`NORMAL_COMPUTED`
    token), ``recomputed_rows`` (more), ``computed_tokens`` (prompt tokens decode computed,
    :func:`computed_on_decode`, over ``rows``) and ``recomputed_tokens`` (over
    ``recomputed_rows``). Apart: ``local_rows`` and ``local_tokens``, rows prefilled on decode on
    purpose (``pools.local_prefill_tokens``) and their prompt tokens."""
    c = dict.fromkeys(COUNT_KEYS, 0)
    for decode_worker, error, prompt, kv, handed_off in rows:
        failed = error is not None and str(error).startswith(ERROR_PREFIX)
        if decode_worker is None or (error is not None and not failed):
            continue
        prompt, kv = prompt or 0, kv or 0
        if not (handed_off or failed):
            c["local_rows"] += 1
            c["local_tokens"] += prompt
            continue
        computed = computed_on_decode(prompt, kv)
        c["rows"] += 1
        c["prompt_tokens"] += prompt
        c["computed_tokens"] += computed
        if computed > NORMAL_COMPUTED:
            c["recomputed_rows"] += 1
            c["recomputed_tokens"] += computed
        else:
            c["kv_loaded_rows"] += 1
    return c


def add_counts(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int]:
    """Two :func:`kv_counts` summed (None, or a key missing, as 0: a done marker written before
    these counts)."""
    return {k: (a or {}).get(k, 0) + (b or {}).get(k, 0) for k in COUNT_KEYS}
