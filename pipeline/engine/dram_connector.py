"""``DramTierConnector``: a vLLM KV connector that moves KV through the decode worker's host-DRAM
tier (:mod:`pipeline.engine.dram_pool`). Loaded by vLLM through
``KVTransferConfig(kv_connector="DramTierConnector", kv_connector_module_path="pipeline.engine.dram_connector")``
when ``offload=dram``; one class serves both roles.

Prefill engine (``kv_producer``). A request whose ``kv_transfer_params`` carry ``"dram"`` (the
decode pool's NIXL metadata and the slots reserved for it) keeps its blocks when it finishes
(``request_finished`` returns True). Before the next forward pass the worker posts a NIXL WRITE
of them into those slots, one descriptor per region and run of consecutive blocks, with the request id as
the completion notification; when NIXL reports the write done, ``get_finished`` returns the id
and vLLM frees the blocks. The prefill worker never waits for decode capacity: the slots were
reserved before its prefill began.

Decode engine (``kv_consumer``). A request whose ``kv_transfer_params`` carry ``"dram_slots"``
has its prompt's KV (all but the last prompt token, which vLLM computes to get the first
logits) matched from the pool; when the scheduler has allocated its blocks, the worker copies
pool slots -> KV blocks before the step's forward pass (``start_load_kv``, synchronous). A
request preempted for lack of KV blocks comes back through the same match, so it reloads its
prompt from the pool and recomputes only the tokens it had generated. The slots stay reserved
until the decode role process sees the request finish.

``kv_connector_extra_config``: ``progress_delay_us`` (the NIXL agent's progress-thread delay, see
:mod:`pipeline.engine.nixl_agent`). A decode request's ``kv_transfer_params``: ``dram_slots`` (one slot
per prompt block) and ``dram_pool`` (``path`` of the pool file, ``num_slots``); the engine maps
the pool on its first load.

Tensor parallelism: the pool holds every KV head of a block (:mod:`pipeline.engine.dram_pool`);
each rank of a TP-``n`` engine writes (prefill) or reads (decode) its own heads' part of each
slot (:meth:`~pipeline.engine.dram_pool.BlockRegions.shard`), and each prefill rank sends its
own completion notification, so the decode role process waits for ``model.prefill_tp`` of them.
vLLM reports a prefill request's blocks free once every rank's write is done.

Statistics (``get_kv_connector_stats``, recorded per step in the worker metrics, see
:data:`pipeline.io.metrics.KV_STAT_COLUMNS`). Prefill, per completed write (NIXL's field names,
seconds and bytes): ``post_duration``, ``transfer_duration``, ``bytes_transferred``,
``num_descriptors``, ``held_after_prefill`` (request finished -> write done); per request,
``freed_after_prefill`` (request finished -> vLLM freed its blocks, at the end of the step in
which the write completed). Decode, per load: ``load_tokens``, ``load_recompute_tokens`` (tokens
the engine computes itself after it), ``load_after_preemption`` (0/1).
"""
from __future__ import annotations

import base64
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from pipeline.engine.idle import idle_steps, set_parked
from pipeline.engine.nixl_agent import DEFAULT_PTHR_DELAY_US, with_progress_delay
from pipeline.engine.dram_pool import BlockRegions, copy_blocks, descriptors

if TYPE_CHECKING:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

_STAT_KEYS = ("post_duration", "transfer_duration", "bytes_transferred", "num_descriptors", "held_after_prefill",
              "freed_after_prefill", "load_tokens", "load_recompute_tokens", "load_after_preemption")


@dataclass
class _Send:
    request_id: str
    block_ids: list[int]
    pool: dict[str, Any]  # DramPool.describe() + "slots"
    finished_at: float  # time.time() when the prefill request finished


@dataclass
class _Load:
    request_id: str
    block_ids: list[int]  # KV cache blocks to fill
    slots: list[int]  # pool slots to fill them from
    pool_path: str  # the pool's shared-memory file
    pool_slots: int  # slots in the pool
    tokens: int = 0  # tokens whose KV the load brings
    recompute: int = 0  # tokens the engine computes itself after the load (last prompt token + any generated)
    preempted: bool = False  # the request comes back after a preemption


@dataclass
class DramTierMetadata(KVConnectorMetadata):
    sends: list[_Send] = field(default_factory=list)
    loads: list[_Load] = field(default_factory=list)
    freed: list[tuple[str, float]] = field(default_factory=list)  # (request id, seconds prefill end -> blocks freed)


@dataclass
class DramTierStats(KVConnectorStats):
    def __post_init__(self):
        for k in _STAT_KEYS:
            self.data.setdefault(k, [])

    def reset(self):
        self.data = {k: [] for k in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k in _STAT_KEYS:
            self.data[k].extend(other.data.get(k, ()))
        return self

    def reduce(self) -> dict[str, int | float]:
        n = len(self.data["transfer_duration"])
        return {"num_transfers": n, "bytes": sum(self.data["bytes_transferred"])}

    def is_empty(self) -> bool:
        return not any(self.data[k] for k in ("transfer_duration", "freed_after_prefill", "load_tokens"))


class DramTierConnector(KVConnectorBase_V1):
    """See the module docstring."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config
        self.producer = extra.is_kv_producer
        self.block_size = vllm_config.cache_config.block_size
        self.delay_us = int(extra.get_from_extra_config("progress_delay_us", DEFAULT_PTHR_DELAY_US))
        # scheduler side
        self._sends: list[_Send] = []
        self._loads: list[_Load] = []
        self._local_hits: dict[str, int] = {}  # request id -> local prefix-cache hit (tokens)
        self._unfinished_sends: dict[str, float] = {}  # request id -> when it finished (time.time())
        self._freed: list[tuple[str, float]] = []
        # a prefill engine that only holds KV steps at a slower pace (pipeline.engine.idle)
        self._idle = idle_steps(vllm_config, role)
        # worker side
        self._kv: BlockRegions | None = None
        self._tp_rank, self._tp = 0, 1  # this worker's TP rank and the engine's TP size
        self._pool: BlockRegions | None = None
        self._pool_path: str | None = None
        self._agent = None
        self._remotes: dict[str, str] = {}  # pool agent name -> NIXL remote name
        self._posted: queue.Queue[tuple | None] = queue.Queue()
        self._done: queue.Queue[tuple[str, tuple | None]] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._stats = DramTierStats()

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if self.producer or "dram_slots" not in params:
            return 0, False
        # Every prompt token's KV is in the pool; vLLM computes the last one itself (its logits
        # give the next token), so match up to it.
        self._local_hits[request.request_id] = num_computed_tokens
        return max(request.num_prompt_tokens - 1 - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        if num_external_tokens <= 0:
            return
        slots = request.kv_transfer_params["dram_slots"]
        block_ids = blocks.get_block_ids()[0]
        # The load starts after the local prefix-cache hit (whole blocks, already in the cache;
        # vLLM sets request.num_computed_tokens only after this call).
        local = self._local_hits.pop(request.request_id, 0)
        first, last = local // self.block_size, -(-(local + num_external_tokens) // self.block_size)
        pool = request.kv_transfer_params["dram_pool"]
        self._loads.append(_Load(
            request.request_id, list(block_ids[first:last]), list(slots[first:last]), pool["path"],
            int(pool["num_slots"]), tokens=num_external_tokens,
            recompute=request.num_tokens - local - num_external_tokens, preempted=request.num_preemptions > 0))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = DramTierMetadata(self._sends, self._loads, self._freed)
        if self._idle is not None:
            meta.pd_park = self._idle.step(scheduler_output.total_num_scheduled_tokens,
                                           bool(self._sends or self._loads)) > 0
        self._sends, self._loads, self._freed = [], [], []
        return meta

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        self._local_hits.pop(request.request_id, None)
        params = request.kv_transfer_params or {}
        if not self.producer or "dram" not in params:
            return False, None
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted: nothing to send
        pool = params["dram"]
        n = -(-request.num_prompt_tokens // self.block_size)
        if n > len(pool["slots"]):
            raise ValueError(f"request {request.request_id}: {n} KV blocks for {len(pool['slots'])} reserved slots")
        self._sends.append(_Send(request.request_id, list(block_ids[:n]), pool, time.time()))
        self._unfinished_sends[request.request_id] = time.time()
        return True, {"dram": True, "blocks": n}

    def update_connector_output(self, connector_output) -> None:
        # vLLM frees the blocks of these requests right after this call.
        for rid in connector_output.finished_sending or ():
            finished_at = self._unfinished_sends.pop(rid, None)
            if finished_at is not None:
                self._freed.append((rid, time.time() - finished_at))

    def has_pending_push_work(self) -> bool:
        return bool(self._unfinished_sends)

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]):
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        self._kv = BlockRegions.from_kv_caches(kv_caches, self._kv_cache_config.num_blocks)
        self._tp_rank, self._tp = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        if self.producer:
            from nixl._api import nixl_agent, nixl_agent_config

            on_gpu = next(iter(kv_caches.values())).is_cuda
            with with_progress_delay(self.delay_us):
                self._agent = nixl_agent(f"pd-prefill-{uuid.uuid4().hex[:12]}", nixl_agent_config(backends=["UCX"]))
            mem = "VRAM" if on_gpu else "DRAM"
            self._agent.register_memory(
                [(v.data_ptr(), v.numel(), self._kv.device_id, "") for v in self._kv.views], mem)
            self._mem = mem
            self._writer = threading.Thread(target=self._writer_loop, name="pd-dram-writer", daemon=True)
            self._writer.start()

    def _map_pool(self, path: str, num_slots: int) -> None:
        """Map the decode worker's pool file (on the first load; the role process creates it
        after this engine has started, once it knows the block size)."""
        import os

        import torch

        slot_bytes = self._kv.slot_bytes * self._tp  # every KV head; this rank holds 1 / tp of them
        size = num_slots * slot_bytes
        if os.path.getsize(path) != size:
            raise RuntimeError(f"DRAM tier {path} holds {os.path.getsize(path)} bytes, not {num_slots} slots x "
                               f"{slot_bytes} bytes of this engine's KV blocks ({self._tp} TP ranks)")
        tensor = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        if self._kv.views[0].is_cuda:
            # Pin the pool so that loads are DMA, not staged through pageable memory.
            err = int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), size, 0))
            if err:
                log.warning("DRAM tier %s: cudaHostRegister failed (cudaError %d); loads go through pageable "
                            "memory", path, err)
            else:  # tools/gpu_dram_check.py looks for this line
                log.info("DRAM tier %s pinned with cudaHostRegister: %d bytes", path, size)
        self._pool = BlockRegions.pool(tensor.data_ptr(), slot_bytes, len(self._kv.bases), num_slots,
                                       tensor).shard(self._tp_rank, self._tp)
        self._pool_tensor, self._pool_path = tensor, path

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Called before every step's forward pass (``start_load_kv`` runs after it unless the
        step has loads): post this step's writes here so that they overlap the forward pass."""
        super().bind_connector_metadata(connector_metadata)
        set_parked(getattr(connector_metadata, "pd_park", False))
        if not isinstance(connector_metadata, DramTierMetadata):
            return
        for rid, freed_s in connector_metadata.freed:
            self._stats.data["freed_after_prefill"].append(freed_s)
        for send in connector_metadata.sends:
            try:
                self._posted.put((send, self._post(send)))
            except Exception as exc:  # noqa: BLE001 (the decode worker times out; the owner retries)
                log.warning("KV write of %s into the DRAM tier failed: %s", send.request_id, exc)
                self._done.put((send.request_id, None))

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, DramTierMetadata):
            return
        if not meta.loads:
            return
        for load in meta.loads:
            if self._pool is None or self._pool_path != load.pool_path:
                self._map_pool(load.pool_path, load.pool_slots)
            copy_blocks(self._pool, load.slots, self._kv, load.block_ids)
            self._stats.data["load_tokens"].append(load.tokens)
            self._stats.data["load_recompute_tokens"].append(load.recompute)
            self._stats.data["load_after_preemption"].append(int(load.preempted))
        if self._kv.views and self._kv.views[0].is_cuda:
            import torch

            torch.cuda.current_stream().synchronize()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        return

    def wait_for_save(self):
        return

    def _writer_loop(self) -> None:
        """The writer thread: waits for each posted write to finish and hands it back to
        :meth:`get_finished`."""
        while True:
            item = self._posted.get()
            if item is None:
                return
            send, (handle, t0, post_s, nbytes, ndesc) = item
            state = self._agent.check_xfer_state(handle)
            while state == "PROC":
                time.sleep(0.0005)
                state = self._agent.check_xfer_state(handle)
            stats = (post_s, time.perf_counter() - t0, nbytes, ndesc, time.time() - send.finished_at)
            self._agent.release_xfer_handle(handle)
            if state != "DONE":  # the decode worker times out waiting; the owner prefills the row again
                log.warning("KV write of %s into the DRAM tier failed (NIXL state %s)", send.request_id, state)
                stats = None
            self._done.put((send.request_id, stats))

    def _post(self, send: _Send) -> tuple[Any, float, float, int, int]:
        pool = send.pool
        name = pool["agent"]
        if name not in self._remotes:
            self._remotes[name] = self._agent.add_remote_agent(base64.b64decode(pool["metadata"]))
        dst = BlockRegions.pool(int(pool["base"]), int(pool["slot_bytes"]), len(self._kv.bases),
                                int(pool["num_slots"])).shard(self._tp_rank, self._tp)
        slots = list(pool["slots"])[:len(send.block_ids)]
        src_rows, dst_rows = descriptors(self._kv, send.block_ids, dst, slots)
        t0 = time.perf_counter()
        handle = self._agent.initialize_xfer(
            "WRITE", self._agent.get_xfer_descs(src_rows, self._mem), self._agent.get_xfer_descs(dst_rows, "DRAM"),
            self._remotes[name], str(pool["notif"]).encode())
        if self._agent.transfer(handle) == "ERR":
            raise RuntimeError("NIXL could not post the write")
        return handle, t0, time.perf_counter() - t0, int(src_rows[:, 1].sum()), len(src_rows)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done: set[str] = set()
        while not self._done.empty():
            rid, stats = self._done.get_nowait()
            done.add(rid)
            if stats is not None:
                for k, v in zip(("post_duration", "transfer_duration", "bytes_transferred", "num_descriptors",
                                 "held_after_prefill"), stats):
                    self._stats.data[k].append(v)
        return (done or None), None

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._stats.is_empty():
            return None
        out = DramTierStats(data={k: list(v) for k, v in self._stats.data.items()})
        self._stats.reset()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return DramTierStats(data=data if data is not None else {})

    def shutdown(self):
        if self._writer is not None:
            self._posted.put(None)
            self._writer.join(timeout=5)
