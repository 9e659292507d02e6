"""One request through a vLLM engine: its sampling parameters, and streaming its output with a
timestamp per token."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.config import SamplingConfig

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM


@dataclass
class Streamed:
    """What one request produced. ``token_times`` are wall-clock seconds (``time.time()``) at which
    each output token reached this process, one per entry of ``token_ids``."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | None = None  # the stop string, or the stop token id as text, that ended it
    logprobs: list[list[tuple[int, float]]] | None = None  # per token: its top-k (token id, logprob)
    cumulative_logprob: float | None = None
    num_cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    others: list["Streamed"] = field(default_factory=list)  # samples 1..n-1 (``n`` > 1), in order


def sampling_params(sampling: SamplingConfig, kv_transfer_params: dict[str, Any] | None = None) -> "SamplingParams":
    """vLLM sampling parameters for ``sampling`` (every field, structured output as vLLM's
    ``StructuredOutputsParams``) that stream new tokens only (``DELTA``), optionally carrying
    ``kv_transfer_params`` for a KV connector."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    structured = None
    if sampling.json_schema is not None or sampling.regex is not None or sampling.choice is not None:
        structured = StructuredOutputsParams(json=sampling.json_schema, regex=sampling.regex,
                                             choice=list(sampling.choice) if sampling.choice else None)
    return SamplingParams(
        max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=sampling.top_k, min_p=sampling.min_p, seed=sampling.seed,
        repetition_penalty=sampling.repetition_penalty, presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty, stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None, ignore_eos=sampling.ignore_eos,
        min_tokens=sampling.min_tokens, logprobs=sampling.logprobs, structured_outputs=structured, n=sampling.n,
        output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None,
    )


def prefill_params(kv_transfer_params: dict[str, Any]) -> "SamplingParams":
    """A prefill worker's request: compute the prompt's KV and one (discarded) greedy token; the
    row's own sampling applies on the decode worker, which computes its first token itself."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA,
                          extra_args={"kv_transfer_params": kv_transfer_params})


class FirstTokenTimeout(TimeoutError):
    """A request produced no output within its first-token deadline (on a decode worker: its KV
    never arrived); vLLM has aborted it."""


class RequestFailed(RuntimeError):
    """vLLM ended a request without a generation: ``finish_reason`` ``"error"`` (on a decode
    worker: the KV it was to load failed, vLLM's ``kv_load_failure_policy="fail"``) or
    ``"abort"`` (the engine aborted it). Its tokens, if any, are not a generation."""

    FINISH_REASONS = ("error", "abort")


async def stream(engine: "AsyncLLM", request_id: str, prompt_token_ids: list[int],
                 params: "SamplingParams", first_token_timeout_s: float | None = None,
                 lora_request: "LoRARequest | None" = None, first_output: asyncio.Event | None = None) -> Streamed:
    """Run one request to completion, timestamping every output token as it arrives; with
    ``lora_request``, through that LoRA adapter (:mod:`pipeline.engine.lora`). With ``params.n``
    > 1 (vLLM's own parallel sampling) the result is sample 0 with samples 1..n-1 in ``others``.
    ``first_output`` is set when the first output arrives.

    Raises:
        FirstTokenTimeout: no output within ``first_token_timeout_s`` seconds (the request is
            aborted in the engine, freeing its blocks).
        RequestFailed: vLLM finished the request with ``finish_reason`` "error" or "abort".
        Exception: whatever vLLM raises for the request (for example a prompt longer than the
            context).
    """
    samples = [Streamed() for _ in range(params.n)]
    outputs = aiter(engine.generate({"prompt_token_ids": prompt_token_ids}, params, request_id,
                                    lora_request=lora_request))
    try:
        first = True
        while True:
            try:
                if first and first_token_timeout_s is not None:
                    ro = await asyncio.wait_for(anext(outputs), first_token_timeout_s)
                else:
                    ro = await anext(outputs)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise FirstTokenTimeout(
                    f"no output within {first_token_timeout_s:g} s of submitting the request") from None
            if first and first_output is not None:
                first_output.set()
            first = False
            now = time.time()
            for completion in ro.outputs:
                out = samples[completion.index]
                if completion.logprobs is not None:
                    out.logprobs = (out.logprobs or []) + [
                        sorted(((tid, lp.logprob) for tid, lp in step.items()), key=lambda t: -t[1])
                        for step in completion.logprobs]
                    out.cumulative_logprob = completion.cumulative_logprob
                out.token_ids.extend(completion.token_ids)
                out.token_times.extend([now] * len(completion.token_ids))
                out.text += completion.text
                if completion.finish_reason in RequestFailed.FINISH_REASONS:
                    raise RequestFailed(f"vLLM ended the request with finish_reason {completion.finish_reason!r} "
                                        f"after {len(out.token_ids)} tokens")
                if completion.finish_reason is not None:
                    out.finish_reason = completion.finish_reason
                    out.stop_reason = None if completion.stop_reason is None else str(completion.stop_reason)
            # num_cached_tokens is reported with the first output; keep the largest value seen.
            samples[0].num_cached_tokens = max(samples[0].num_cached_tokens, ro.num_cached_tokens or 0)
            if ro.finished:
                samples[0].kv_transfer_params = ro.kv_transfer_params
    finally:
        await outputs.aclose()  # aborts the request in the engine if it did not finish
    samples[0].others = samples[1:]
    return samples[0]


async def stream_row(engine: "AsyncLLM", request_id: str, prompt_token_ids: list[int], sampling: SamplingConfig,
                     lora_request: "LoRARequest | None" = None) -> Streamed:
    """A row computed wholly by ``engine`` (no KV from elsewhere): vLLM's own ``n`` draws its
    samples, except greedy ones (vLLM refuses ``n`` > 1 at temperature 0), drawn as
    :func:`stream_samples` does (identical samples)."""
    if sampling.n > 1 and sampling.temperature == 0:
        return await stream_samples(engine, request_id, prompt_token_ids, sampling, None, lora_request=lora_request)
    return await stream(engine, request_id, prompt_token_ids, sampling_params(sampling), lora_request=lora_request)


async def stream_samples(engine: "AsyncLLM", request_id: str, prompt_token_ids: list[int],
                         sampling: SamplingConfig, kv_transfer_params: dict[str, Any] | None,
                         first_token_timeout_s: float | None = None,
                         lora_request: "LoRARequest | None" = None) -> Streamed:
    """``sampling.n`` samples of a prompt whose KV arrives through a KV connector
    (``kv_transfer_params``; None: the engine computes it), moved once: sample 0 is the request
    that loads (or computes) the KV; once its first token is out (the prompt's KV is in this
    engine's prefix cache) samples 1..n-1 run as requests of their own that hit that cache, each with seed ``sampling.seed + i`` as vLLM's
    own ``n`` gives its samples (vLLM's ``n`` would load the KV once per sample). Returns sample
    0 with the others in ``others``.

    Raises:
        FirstTokenTimeout, RequestFailed: as :func:`stream`, for sample 0 (the KV) or any other.
    """
    one = dataclasses.replace(sampling, n=1)
    first_output = asyncio.Event()
    head = asyncio.ensure_future(stream(engine, request_id, prompt_token_ids, sampling_params(one, kv_transfer_params),
                                        first_token_timeout_s, lora_request, first_output))
    if sampling.n == 1:
        return await head
    rest: list[asyncio.Future] = []
    try:
        waiting = asyncio.ensure_future(first_output.wait())
        await asyncio.wait({head, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if head.done():
            head.result()  # raises the head's failure
        rest = [asyncio.ensure_future(stream(
            engine, f"{request_id}-s{i}", prompt_token_ids,
            sampling_params(dataclasses.replace(one, seed=None if one.seed is None else one.seed + i)),
            lora_request=lora_request)) for i in range(1, sampling.n)]
        out = await head
        out.others = list(await asyncio.gather(*rest))
        return out
    finally:
        for f in (head, *rest):
            f.cancel()
