"""vLLM's NIXL connectors with a progress thread that does not spin (see :mod:`pipeline.engine.nixl_agent`);
on prefill engines, empty steps paced while the engine only holds KV for decode
(:mod:`pipeline.engine.idle`); on decode engines, the KV blocks of a hand-off aborted while its KV
was on the way taken back once no prefill engine can still WRITE them (:mod:`pipeline.engine.reclaim`).

Loaded by vLLM through ``KVTransferConfig(kv_connector_module_path="pipeline.engine.connector")``;
``transport.connector`` keeps vLLM's names (``NixlPushConnector``, ``NixlConnector``) and
:func:`pipeline.engine.build.build_engine` selects the class of the same name here. Everything
but the NIXL agent's progress-thread delay, the pacing of a prefill engine's empty steps, the
blocks taken back after an abort and (pull) the decode engine's load in step is vLLM's own
connector, unchanged.

``kv_connector_extra_config["progress_delay_us"]``: the progress thread's ``poll()`` timeout in
microseconds (``transport.nixl_progress_delay_us``; 0 = NIXL's busy loop, vLLM's default).
``sync_kv_load`` and ``kv_timeout_s``: see :mod:`pipeline.engine.sync_load`.
"""
from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlPullConnector, NixlPushConnector

from pipeline.engine.idle import idle_steps, set_parked
from pipeline.engine.nixl_agent import DEFAULT_PTHR_DELAY_US, with_progress_delay
from pipeline.engine.reclaim import AbortReclaimMixin
from pipeline.engine.sync_load import SyncLoadMixin

#: ``NixlConnectorMetadata`` fields that carry transfer work for the worker this step.
_TRANSFER_FIELDS = ("reqs_to_recv", "reqs_to_save", "reqs_to_send", "push_registrations", "push_finished_blocks")


def _delay_us(vllm_config) -> int:
    return int(vllm_config.kv_transfer_config.get_from_extra_config("progress_delay_us", DEFAULT_PTHR_DELAY_US))


class _ProgressDelayMixin:
    def __init__(self, vllm_config, role, kv_cache_config):
        with with_progress_delay(_delay_us(vllm_config)):
            super().__init__(vllm_config, role, kv_cache_config)
        self._idle = idle_steps(vllm_config, role)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        if self._idle is not None:
            meta.pd_park = self._idle.step(scheduler_output.total_num_scheduled_tokens,
                                           any(getattr(meta, f, None) for f in _TRANSFER_FIELDS)) > 0
        return meta

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        set_parked(getattr(connector_metadata, "pd_park", False))


class NixlPushConnector(_ProgressDelayMixin, AbortReclaimMixin, NixlPushConnector):  # noqa: F811 (same name, on purpose)
    """vLLM's push (prefill WRITEs) NIXL connector; its agent's progress thread sleeps in ``poll()``, and
    a decode engine takes back the blocks of an aborted hand-off whose KV never came."""


class NixlConnector(_ProgressDelayMixin, AbortReclaimMixin, SyncLoadMixin, NixlPullConnector):
    """vLLM's pull (decode READs) NIXL connector; its agent's progress thread sleeps in ``poll()``, and a
    decode engine READs a hand-off's KV in the step that schedules it (:mod:`pipeline.engine.sync_load`,
    ``transport.sync_kv_load``)."""
