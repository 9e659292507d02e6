"""Decode engines that take back the KV blocks of a hand-off aborted while its KV was on the way.

A decode request waits in ``WAITING_FOR_REMOTE_KVS`` until its worker-side connector reports the
prefill engine's KV received (``finished_recving``). Aborted meanwhile (the decode worker drops a
hand-off its prefill worker withdrew, or whose KV did not come in time), vLLM keeps the request
and its blocks until that report comes, since a WRITE still landing in freed blocks would corrupt
another request's KV (vLLM PR #32255). When the prefill engine is gone (its node lost, its worker
killed) the report never comes: the blocks leak for the engine's life, and the engine never goes
idle (``Scheduler.has_requests`` stays true), stepping ~600 empty steps a second with nothing
running or waiting. Found by the chaos soak (``tools/soak.py``, BENCHMARKS.md); reported upstream
as vLLM issue #46283 (fix proposed in vLLM PR #46289, not released).

Here the decode engine's scheduler-side connector notes each request finished while it was still
waiting for KV, and ``abort_reclaim_s`` seconds later (``kv_connector_extra_config``; default
:func:`reclaim_after_s`: twice the prefill side's KV lease, which is no longer renewed once decode
has dropped the request, so the prefill engine has freed its blocks and will WRITE nothing more)
names it in the step's metadata (``pd_reclaim``). The worker-side connector then reports it
received, and the scheduler frees its blocks as for any finished request whose KV arrived late.
A real report that comes after that is dropped before vLLM sees it (vLLM asserts the request is
still known).
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def reclaim_after_s(kv_transfer_config) -> float:
    """Seconds after its abort that a decode request's KV blocks are taken back:
    ``abort_reclaim_s`` from ``kv_connector_extra_config``, else twice ``kv_lease_duration``
    (vLLM's default lease: 30 s), at least 60 s."""
    explicit = kv_transfer_config.get_from_extra_config("abort_reclaim_s", None)
    if explicit is not None:
        return float(explicit)
    return max(60.0, 2.0 * float(kv_transfer_config.get_from_extra_config("kv_lease_duration", 30)))


class AbortReclaimMixin:
    """For vLLM's NIXL connector facades; see the module doc. Acts only on ``kv_consumer`` engines."""

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        kv = vllm_config.kv_transfer_config
        self._reclaim_on = kv.kv_role == "kv_consumer"
        self._reclaim_after_s = reclaim_after_s(kv)
        self._reclaim_clock = time.monotonic
        # Scheduler side.
        self._loads_async: set[str] = set()  # matched for an asynchronous load, not yet allocated
        self._awaiting_kv: set[str] = set()  # waiting for remote KV, not yet reported received
        self._aborted: dict[str, float] = {}  # finished while awaiting -> when to take its blocks back
        self._reclaimed: dict[str, bool] = {}  # named in pd_reclaim -> its (first) report seen
        # Worker side.
        self._to_report: set[str] = set()

    # Scheduler side.

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if self._reclaim_on and load_async:
            self._loads_async.add(request.request_id)
        return count, load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        # vLLM puts a request whose load is asynchronous in WAITING_FOR_REMOTE_KVS after this
        # call; a load in step (pipeline.engine.sync_load) never waits there and is never reported.
        if request.request_id in self._loads_async:
            self._loads_async.discard(request.request_id)
            if num_external_tokens > 0:
                self._awaiting_kv.add(request.request_id)

    def request_finished(self, request, block_ids):
        self._note_finished(request.request_id)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):  # what vLLM calls on a connector with HMA
        self._note_finished(request.request_id)
        return super().request_finished_all_groups(request, block_ids)

    def _note_finished(self, rid: str) -> None:
        self._loads_async.discard(rid)
        if rid in self._awaiting_kv:
            self._awaiting_kv.discard(rid)
            self._aborted[rid] = self._reclaim_clock() + self._reclaim_after_s

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        if self._aborted:
            now = self._reclaim_clock()
            due = [rid for rid, at in self._aborted.items() if at <= now]
            for rid in due:
                del self._aborted[rid]
                self._reclaimed[rid] = False
            if due:
                log.warning("decode engine: taking back the KV blocks of %d request(s) aborted %.0f s ago "
                            "while their KV was on the way (no prefill engine reported it)",
                            len(due), self._reclaim_after_s)
                meta.pd_reclaim = due
        return meta

    def update_connector_output(self, connector_output):
        received = connector_output.finished_recving
        if received and self._reclaim_on:
            late = set()
            for rid in received:
                self._awaiting_kv.discard(rid)
                self._aborted.pop(rid, None)
                if rid in self._reclaimed:
                    if self._reclaimed[rid]:
                        late.add(rid)  # its blocks were freed on the first report
                    self._reclaimed[rid] = True
            if late:
                connector_output.finished_recving = received - late
        super().update_connector_output(connector_output)

    # Worker side.

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self._to_report.update(getattr(connector_metadata, "pd_reclaim", None) or ())

    def get_transfer_results(self, finished_req_ids):
        results = super().get_transfer_results(finished_req_ids)
        if self._to_report:
            results.finished_recving = set(results.finished_recving) | self._to_report
            self._to_report = set()
        return results
