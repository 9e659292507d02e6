"""The prefill hand-off of one row: (reserve DRAM-tier slots,) prefill, hand off to a decode
worker, wait for the generation, and serve the row again when its decode worker is lost or its KV
never arrived, under an explicit :class:`RetryPolicy`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config import Config, SamplingConfig
from pipeline.engine.lora import lora_request
from pipeline.engine.stream import Streamed, prefill_params, stream
from pipeline.io.output import RowResult, served_row
from pipeline.io.prompts import Prompt
from pipeline.roles.errors import DecodeLost, DecodeUnavailable
from pipeline.roles.router import DecodeRouter
from pipeline.runtime import failpoints
from pipeline.runtime.ids import request_id
from pipeline.runtime.rundir import RunDir
from pipeline.wire.messages import Handoff, Reserve, Result

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

# What the prefill request tells vLLM's NIXL connectors: keep the KV for a remote decode.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


async def wait_for_decode(run: RunDir, count: int, timeout_s: float) -> dict[int, dict[str, str]]:
    """Wait until ``count`` decode ranks have published endpoints in the run directory.

    Raises:
        DecodeUnavailable: fewer than ``count`` appeared within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        endpoints = run.decode_endpoints()
        if len(endpoints) >= count:
            return endpoints
        if time.monotonic() > deadline:
            raise DecodeUnavailable(
                f"{len(endpoints)} of {count} decode workers came up within {timeout_s:.0f} s; "
                f"see their logs in {run.logs}")
        await asyncio.sleep(0.5)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a row is served before its failure is final: ``tries`` prefills and hand-offs
    (``transport.handoff_retries + 1``). Retried: a lost decode worker or a reservation that got
    no answer (:class:`~pipeline.roles.errors.DecodeLost`, ``TimeoutError``: raised on the last
    try), and KV that never arrived (``Result.retry``: an error row after the last try). Anything
    else fails the row at once."""

    tries: int

    RETRIED = (DecodeLost, TimeoutError)

    def again(self, n: int, row_key: str, why: object, what: str = "serving it again") -> bool:
        """Whether try ``n`` (0-based) is followed by another; logs the retry."""
        if n + 1 >= self.tries:
            return False
        log.warning("row %s: %s; %s (try %d of %d)", row_key, why, what, n + 2, self.tries)
        return True


def kv_tokens_needed(prompt_tokens: int, sampling: SamplingConfig, max_model_len: int) -> int:
    """Tokens of KV cache a decode worker may need for a request: the prompt's, plus each of its
    ``sampling.n`` samples' new tokens (the samples share the prompt's blocks). A sample ends at
    the context's end (vLLM's finish ``"length"``) whatever ``max_new_tokens`` asks, so a larger
    value needs no more KV than ``max_model_len - prompt_tokens`` per sample."""
    return prompt_tokens + sampling.n * max(0, min(sampling.max_new_tokens, max_model_len - prompt_tokens))


class PrefillHandoff:
    """Serves rows on a prefill worker: each row's prompt is prefilled on ``engine`` (one token,
    ``do_remote_decode``) and handed to a decode worker through ``router``.

    A row whose prompt is shorter than ``pools.local_prefill_tokens`` skips all of that: it is
    handed to a decode worker without KV, and prefilled there (:meth:`is_local`).

    With the DRAM tier (``offload=dram``) slots in a decode worker's tier are reserved before the
    prefill: the prefill engine writes the KV there when the prefill ends and frees its own blocks
    at once; the hand-off then goes to that worker.
    """

    def __init__(self, cfg: Config, engine: "AsyncLLM", router: DecodeRouter, worker: str,
                 attempt: float, kv_bytes_per_token: int, samples: bool):
        self.cfg, self.engine, self.router, self.worker = cfg, engine, router, worker
        self.attempt, self.kv_bytes_per_token = attempt, kv_bytes_per_token
        self.dram = cfg.offload.dram(cfg.model.max_model_len)
        self.block_size = engine.vllm_config.cache_config.block_size
        self.policy = RetryPolicy(cfg.transport.handoff_retries + 1)
        self.samples = samples  # the sample columns are lists (RunDir.sample_lists)
        self.freeze_s, self.prefills = failpoints.prefill_freeze_s(), 0  # fault injection (tests)
        # pools.elastic (pipeline.roles.elastic.ElasticPrefill): a hand-off that failed with no
        # decode rank left alive and reachable is not tried again here; the row is served alone
        self.no_retry_without_decode = False
        # pools.elastic: name each hand-off's rank before its prefill (DecodeRouter.announce)
        self.announce = False

    async def serve(self, p: Prompt) -> RowResult:
        """The row's generation (or error row).

        Raises:
            KVTooLarge: no decode worker could ever hold the request (before any prefill).
            DecodeLost, TimeoutError: the last try lost its decode worker or got no answer.
            DecodeUnavailable: no decode worker was alive for ``transport.connect_timeout_s``.
        """
        sampling = p.sampling or self.cfg.job.sampling
        need = kv_tokens_needed(len(p.token_ids), sampling, self.cfg.model.max_model_len)
        local = self.is_local(p)
        # A request no decode worker can hold is an error row before it costs a prefill.
        self.router.check_fits(need, len(p.token_ids) if self.dram and not local else None)
        if local:
            return await self._serve_local(p, sampling, need)
        capacity_wait = 0.0
        tried: set[int] = set()  # decode ranks this row was sent to: a retry prefers another
        for n in range(self.policy.tries):
            rid = request_id(p.row_key, n)
            route = p.prefix_key if n == 0 else None
            rank, kv_params = None, REMOTE_DECODE
            if self.dram:
                t_wait = time.time()
                try:
                    rank, pool = await self._reserve(p, rid, need, route, tried)
                except self.policy.RETRIED as exc:
                    if not self.policy.again(n, p.row_key, exc, "reserving again"):
                        raise
                    continue
                finally:
                    capacity_wait += time.time() - t_wait
                kv_params = {"dram": pool}
            elif self.announce:
                await self.router.announce(rid, need, route, self.decode_wait_s(), tried)
            t0 = time.time()
            pre = await self._prefill(p, rid, kv_params, rank)
            t_prefilled = time.time()
            self.prefills += 1
            if self.freeze_s and self.prefills == 2:
                failpoints.freeze_children(self.freeze_s)
            try:
                res = await self.router.handoff(Handoff(
                    row_key=p.row_key, request_id=rid, prefill_worker=self.worker, attempt=self.attempt,
                    prompt_token_ids=p.token_ids, sampling=dataclasses.asdict(sampling),
                    kv_transfer_params=pre.kv_transfer_params, prefill_done_at=t_prefilled, lora=p.lora),
                    wait_s=self.decode_wait_s(), route=route, rank=rank, kv_tokens=need,
                    tried=tried)
            except self.policy.RETRIED as exc:
                # The KV this prefill produced is gone with that decode worker (or never
                # arrived): prefill again and hand off to a live one.
                if self._no_decode_left() or not self.policy.again(n, p.row_key, exc):
                    raise
                continue
            # res.retry: the decode worker gave up waiting for this request's KV and aborted it.
            if not res.retry or not self.policy.again(n, p.row_key, res.error):
                break
        return self._row(res, pre, t0, t_prefilled, n + 1, capacity_wait if self.dram else None)

    def decode_wait_s(self) -> float:
        """How long a hand-off waits for a live decode rank: ``transport.connect_timeout_s``, or
        none with :attr:`no_retry_without_decode` (``pools.elastic``: the prefill worker serves
        the row itself; a takeover task that waited the full 600 s for the run's one lost rank
        made the elastic fault test take 13 minutes instead of 4)."""
        return 0.0 if self.no_retry_without_decode else self.cfg.transport.connect_timeout_s

    def _no_decode_left(self) -> bool:
        """With :attr:`no_retry_without_decode`: whether no decode rank is alive and reachable."""
        return self.no_retry_without_decode and not self.router.reachable()

    def is_local(self, p: Prompt) -> bool:
        """Whether ``p`` is prefilled on its decode worker: its prompt is shorter than
        ``pools.local_prefill_tokens`` tokens (moving its KV would cost more than computing it)."""
        return len(p.token_ids) < self.cfg.pools.local_prefill_tokens

    async def _serve_local(self, p: Prompt, sampling, need: int) -> RowResult:
        """Hand ``p`` to a decode worker without KV: that worker prefills it itself (the row has
        no prefill on this worker, no KV hand-off, ``kv_tokens`` 0); served again on a lost
        decode worker like any row."""
        t0 = time.time()
        tried: set[int] = set()
        for n in range(self.policy.tries):
            rid = request_id(p.row_key, n)
            try:
                res = await self.router.handoff(Handoff(
                    row_key=p.row_key, request_id=rid, prefill_worker=self.worker, attempt=self.attempt,
                    prompt_token_ids=p.token_ids, sampling=dataclasses.asdict(sampling), kv_transfer_params={},
                    prefill_done_at=t0, lora=p.lora),
                    wait_s=self.decode_wait_s(), route=p.prefix_key if n == 0 else None,
                    kv_tokens=need, tried=tried)
            except self.policy.RETRIED as exc:
                if not self.policy.again(n, p.row_key, exc):
                    raise
                continue
            break
        return served_row(
            text=res.text, token_ids=res.token_ids, finish_reason=res.finish_reason, error=res.error,
            token_times=res.token_times, prefill_start=t0, prefill_end=None, prefill_worker=self.worker,
            decode_worker=res.decode_worker, kv_tokens=0, kv_bytes=0, decode_arrived_at=res.arrived_at,
            prefix_cached_tokens=0, tries=n + 1, capacity_wait_s=None, stop_reason=res.stop_reason,
            logprobs=res.logprobs, cumulative_logprob=res.cumulative_logprob, others=res.others,
            samples=self.samples)

    async def _reserve(self, p: Prompt, rid: str, need: int, route: str | None,
                       tried: set[int]) -> tuple[int, dict[str, Any]]:
        return await self.router.reserve(Reserve(
            row_key=p.row_key, request_id=rid, prefill_worker=self.worker, attempt=self.attempt,
            blocks=-(-len(p.token_ids) // self.block_size)), need, self.cfg.transport.connect_timeout_s, route,
            tried)

    async def _prefill(self, p: Prompt, rid: str, kv_params: dict[str, Any], rank: int | None) -> Streamed:
        """The 1-token prefill; gives back the row's DRAM-tier reservation if it fails.

        Raises:
            RuntimeError: vLLM returned no ``kv_transfer_params`` (no KV connector configured).
        """
        try:
            pre = await stream(self.engine, rid, p.token_ids, prefill_params(kv_params),
                               lora_request=lora_request(self.cfg, p.lora))
        except BaseException:
            if rank is not None:
                await self.router.release(rank, rid)
            await self.router.withdraw(rid)  # announced (pools.elastic): the rank stops counting it
            raise
        if not pre.kv_transfer_params:
            raise RuntimeError("prefill returned no kv_transfer_params; is a KV connector configured?")
        return pre

    def _row(self, res: Result, pre: Streamed, t0: float, t_prefilled: float, tries: int,
             capacity_wait_s: float | None) -> RowResult:
        error = res.error if not res.retry else f"{res.error} (after {tries} tries)"
        return served_row(
            text=res.text, token_ids=res.token_ids, finish_reason=res.finish_reason, error=error,
            token_times=res.token_times, prefill_start=t0, prefill_end=t_prefilled,
            prefill_worker=self.worker, decode_worker=res.decode_worker, kv_tokens=res.kv_tokens,
            kv_bytes=res.kv_tokens * self.kv_bytes_per_token, decode_arrived_at=res.arrived_at,
            prefix_cached_tokens=pre.num_cached_tokens, tries=tries, capacity_wait_s=capacity_wait_s,
            stop_reason=res.stop_reason, logprobs=res.logprobs, cumulative_logprob=res.cumulative_logprob,
            others=res.others, samples=self.samples)
