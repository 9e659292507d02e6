"""Decode engines that READ a hand-off's KV in the step that schedules it (pull, ``transport.sync_kv_load``).

vLLM's pull connector loads a hand-off's KV asynchronously: the step that admits the request
allocates its blocks and posts the NIXL READ (after that step's forward pass), a later step
sees the READ done (``get_finished``), and only the step after that schedules the request and
computes its first token. Measured on 2 CPU cores, a short prompt's hand-off was half a decode
step (waiting for the step boundary) + two steps + the transfer, when the transfer itself took
2-8 ms (BENCHMARKS.md, "Where the short-prompt hand-off goes").

Here the decode engine's scheduler-side connector reports the KV as loadable synchronously
(``get_num_new_matched_tokens`` returns ``load_async=False``): vLLM schedules the request in the
step that admits it, with the prompt's KV counted as computed, and posts the step's loads before
its forward pass (``SchedulerOutput.has_sync_kv_loads``). The worker-side connector posts the
READs through vLLM's own code and then waits for them (:func:`wait_for_reads`) before the
forward pass, which computes the first token: the hand-off becomes half a step + one step + the
transfer.

What stays vLLM's: the READ itself, its completion notification to the prefill engine (which
frees the blocks there), the NIXL handshake with a new prefill engine (run in vLLM's background
thread; the step waits for it), the conversion of received KV where the two sides' layouts
differ (run before the forward pass here), telemetry, and failure handling: a READ that fails
(or a handshake that fails, or a READ still running after ``kv_timeout_s``, at most half the
prefill side's KV lease) marks the request's blocks invalid
(``get_block_ids_with_load_errors``), and with ``kv_load_failure_policy="fail"`` vLLM ends the
request with ``finish_reason="error"`` in that step, discarding the token computed over them; the
decode worker hands the row back to be prefilled again. Such a request is never reported to the
scheduler as an asynchronous receive (it never waited in ``WAITING_FOR_REMOTE_KVS``).

Only for engines with one KV cache group (vLLM maps block-level load errors back to requests
only then); others keep vLLM's asynchronous load.
"""
from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker

log = logging.getLogger(__name__)

#: Seconds between two polls of a READ's state while a step waits for it (the NIXL progress
#: thread, on the same core, moves the bytes meanwhile).
POLL_S = 1e-4


class SyncLoadMixin:
    """For vLLM's pull connector facade (``NixlPullConnector``); see the module doc. On when the
    engine is a ``kv_consumer`` whose KV cache is one full-attention group and
    ``kv_connector_extra_config`` ``sync_kv_load`` is true. A step waits for its READs at most
    ``kv_timeout_s`` seconds, and at most half the prefill side's KV lease (``kv_lease_duration``,
    vLLM's default 30 s: the prefill engine frees unread blocks after it, and the lease is no
    longer renewed once the READ is posted)."""

    def __init__(self, vllm_config, role, kv_cache_config):
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        super().__init__(vllm_config, role, kv_cache_config)
        kv = vllm_config.kv_transfer_config
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        self._sync_load = (kv.kv_role == "kv_consumer" and bool(kv.get_from_extra_config("sync_kv_load", False))
                           and len(groups) == 1 and isinstance(groups[0].kv_cache_spec, FullAttentionSpec))
        self._sync_timeout_s = min(float(kv.get_from_extra_config("kv_timeout_s", 120.0)),
                                   float(kv.get_from_extra_config("kv_lease_duration", 30)) / 2)
        self._local_hit: dict[str, int] = {}  # scheduler: request id -> tokens of its local prefix-cache hit
        self._sync_scheduled: set[str] = set()  # scheduler: loads for the next metadata
        self._sync_reading: set[str] = set()  # worker: loads not yet reported to the scheduler
        self._early_results = None  # worker: transfer results collected before this step's forward pass

    # Scheduler side.

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if not (self._sync_load and load_async and (request.kv_transfer_params or {}).get("do_remote_prefill")):
            return count, load_async
        # The last prompt token is computed in this step, for the first token's logits (vLLM
        # does the same after an asynchronous load of the whole prompt).
        count = min(count, request.num_tokens - 1 - num_computed_tokens)
        if count <= 0:
            return 0, False
        self._local_hit[request.request_id] = num_computed_tokens
        return count, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        local_hit = self._local_hit.pop(request.request_id, None)
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        sched = self.connector_scheduler
        entry = sched._reqs_need_recv.get(request.request_id)
        if local_hit is None or num_external_tokens == 0 or entry is None:
            return
        # vLLM picks the blocks to READ into as those without a block hash: blocks of an
        # asynchronous load are hashed only once the KV has arrived. A synchronous load's
        # blocks are hashed at allocation, so they are counted here past the local hit instead.
        # The prompt's blocks only: the prefill side has no more (a synchronous load also gets
        # lookahead slots, which vLLM leaves out for an asynchronous one).
        skip, end = local_hit // sched.block_size, -(-request.num_prompt_tokens // sched.block_size)
        to_read = [[b.block_id for b in group[skip:end] if not b.is_null] for group in blocks.blocks]
        sched._reqs_need_recv[request.request_id] = (entry[0], sched.get_exchange_clipped_blocks(to_read),
                                                     tuple(skip for _ in blocks.blocks), True)
        self._sync_scheduled.add(request.request_id)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        meta.pd_sync_loads = self._sync_scheduled & meta.reqs_to_recv.keys()
        for rid in meta.pd_sync_loads:
            # The READ is done before this step's forward pass: no lease renewal is needed.
            self.connector_scheduler._stop_heartbeat(rid)
        self._sync_scheduled = set()
        return meta

    def request_finished(self, request, block_ids):
        self._local_hit.pop(request.request_id, None)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        self._local_hit.pop(request.request_id, None)
        return super().request_finished_all_groups(request, block_ids)

    # Worker side.

    def start_load_kv(self, forward_context, **kwargs) -> None:
        super().start_load_kv(forward_context, **kwargs)
        sync = getattr(self._connector_metadata, "pd_sync_loads", None)
        if sync:
            self._sync_reading |= sync
            wait_for_reads(self.connector_worker, sync, self._sync_timeout_s)
            # vLLM's collection of ended transfers also converts received KV where the two sides'
            # layouts differ and reports failures as invalid blocks: done before the forward pass
            # reads the KV, its results are handed on with the step's own (below).
            self._early_results = super().get_transfer_results(set())

    def get_transfer_results(self, finished_req_ids):
        results = super().get_transfer_results(finished_req_ids)
        if self._early_results is not None:
            early, self._early_results = self._early_results, None
            results.finished_sending |= early.finished_sending
            results.finished_recving |= early.finished_recving
            results.failed_recving |= early.failed_recving
        if self._sync_reading:
            # Reported through get_block_ids_with_load_errors when they failed; the scheduler
            # asserts that a reported receive waited in WAITING_FOR_REMOTE_KVS.
            done = (results.finished_recving | results.failed_recving) & self._sync_reading
            results.finished_recving -= done
            results.failed_recving -= done
            self._sync_reading -= done
        return results


def wait_for_reads(worker: "NixlBaseConnectorWorker", req_ids: set[str], timeout_s: float) -> None:
    """Block until the NIXL READs vLLM's pull worker posted for ``req_ids`` have ended (done or
    failed), posting those whose NIXL handshake completes meanwhile (vLLM bounds a handshake: its
    side-channel socket times out after 5 s, and the request fails). A request that never got a
    READ posted (failed handshake or post) is settled at once; one with a READ still running is
    settled only when no handle of it is in progress, since its blocks go back to the scheduler.
    READs still running after ``timeout_s`` seconds are failed the way vLLM fails a transfer:
    their handles released (NIXL cancels them) and the request reported with invalid blocks; a
    handle NIXL cannot release is waited for. Ended READs are left for ``get_transfer_results``
    to collect (telemetry, handle release, completion report)."""
    deadline = time.monotonic() + timeout_s
    pending = set(req_ids)
    timed_out = False
    while True:
        while not worker._ready_requests.empty():  # handshakes that completed: vLLM's own posting
            worker._read_blocks_for_req(*worker._ready_requests.get_nowait())
        failed = _peek(worker._failed_recv_reqs) | worker._recv_failures
        for rid in list(pending):
            handles = worker._recving_transfers.get(rid)
            if handles is not None:
                if not any(_in_progress(worker, h) for h in handles):
                    pending.discard(rid)
            elif rid not in worker._recving_metadata or rid in failed:
                pending.discard(rid)  # nothing to READ, or failed before a READ was posted
        if not pending:
            return
        if not timed_out and time.monotonic() >= deadline:
            timed_out = True
            for rid in pending & worker._recving_transfers.keys():
                log.error("KV READ for %s did not complete within %g s; failing the request", rid, timeout_s)
                worker._recving_transfers[rid] = [h for h in worker._recving_transfers[rid]
                                                  if not worker._handle_failed_transfer(rid, h)]
                worker._recv_failures.add(rid)
        time.sleep(POLL_S)


def _in_progress(worker, handle) -> bool:
    try:
        return worker.nixl_wrapper.check_xfer_state(handle) == "PROC"
    except Exception:  # noqa: BLE001 (get_transfer_results reports it, as vLLM does)
        return False


def _peek(q: queue.Queue) -> set[str]:
    """The items of ``q``, left in it."""
    with q.mutex:
        return set(q.queue)
