"""vLLM's NIXL connectors with a progress thread that does not spin (see :mod:`pipeline.engine.nixl_agent`).

Loaded by vLLM through ``KVTransferConfig(kv_connector_module_path="pipeline.engine.connector")``;
``transport.connector`` keeps vLLM's names (``NixlPushConnector``, ``NixlConnector``) and
:func:`pipeline.engine.build.build_engine` selects the class of the same name here. Everything
but the NIXL agent's progress-thread delay is vLLM's own connector, unchanged.

``kv_connector_extra_config["progress_delay_us"]``: the progress thread's ``poll()`` timeout in
microseconds (``transport.nixl_progress_delay_us``; 0 = NIXL's busy loop, vLLM's default).
"""
from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlPullConnector, NixlPushConnector

from pipeline.engine.nixl_agent import DEFAULT_PTHR_DELAY_US, with_progress_delay


def _delay_us(vllm_config) -> int:
    return int(vllm_config.kv_transfer_config.get_from_extra_config("progress_delay_us", DEFAULT_PTHR_DELAY_US))


class _ProgressDelayMixin:
    def __init__(self, vllm_config, role, kv_cache_config):
        with with_progress_delay(_delay_us(vllm_config)):
            super().__init__(vllm_config, role, kv_cache_config)


class NixlPushConnector(_ProgressDelayMixin, NixlPushConnector):  # noqa: F811 (same name, on purpose)
    """vLLM's push (prefill WRITEs) NIXL connector; its agent's progress thread sleeps in ``poll()``."""


class NixlConnector(_ProgressDelayMixin, NixlPullConnector):
    """vLLM's pull (decode READs) NIXL connector; its agent's progress thread sleeps in ``poll()``."""
