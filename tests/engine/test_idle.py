"""Pacing of a prefill engine's empty steps (pipeline.engine.idle), on a hand-driven clock: which
steps pause and for how long, and which connectors get a pacer. Whether pacing lowers the
prefill engine's CPU is measured in tools/bench.py (BENCHMARKS.md), not timed here."""

from __future__ import annotations

import pytest

from pipeline.engine.idle import IdleSteps, idle_steps


@pytest.fixture(autouse=True)
def vllm_queue_wait_restored():
    """idle_steps() on a worker-side connector patches vLLM's queue wait in this process (as it
    does in a prefill worker): undo it after each test."""
    from vllm.distributed.device_communicators import shm_broadcast

    original = shm_broadcast.SpinCondition.wait
    yield
    shm_broadcast.SpinCondition.wait = original


class Clock:
    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_empty_steps_pause_only_after_the_grace_period():
    c = Clock()
    idle = IdleSteps(grace_s=0.05, pause_s=0.02, clock=c, sleep=c.sleep)
    assert idle.step(512, False) == 0.0  # a prefill step
    for _ in range(4):  # 40 ms of empty steps: within the grace period, vLLM's pace
        c.now += 0.01
        assert idle.step(0, False) == 0.0
    c.now += 0.011  # 51 ms since the last work
    assert [idle.step(0, False) for _ in range(3)] == [0.02, 0.02, 0.02]
    assert c.slept == [0.02] * 3 and idle.paused_s == pytest.approx(0.06)


@pytest.mark.parametrize("tokens, transfer", [(1, False), (0, True)])
def test_work_ends_the_pause_at_once(tokens, transfer):
    """A step with tokens or with transfer work to post (a WRITE into decode's blocks, a
    registration) runs unpaced, and the next grace period starts from it."""
    c = Clock()
    idle = IdleSteps(grace_s=0.05, pause_s=0.02, clock=c, sleep=c.sleep)
    c.now += 1.0
    assert idle.step(0, False) == 0.02
    assert idle.step(tokens, transfer) == 0.0
    c.now += 0.03
    assert idle.step(0, False) == 0.0


def _vllm_config(kv_role: str, extra: dict):
    from types import SimpleNamespace

    from vllm.config import KVTransferConfig

    return SimpleNamespace(kv_transfer_config=KVTransferConfig(
        kv_connector="NixlConnector", kv_role=kv_role, kv_connector_extra_config=extra))


def test_only_the_prefill_schedulers_connector_is_paced():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    paced = idle_steps(_vllm_config("kv_producer", {"idle_pause_s": 0.03}), KVConnectorRole.SCHEDULER)
    assert paced is not None and paced.pause_s == 0.03
    from vllm.distributed.device_communicators import shm_broadcast

    assert idle_steps(_vllm_config("kv_producer", {}), KVConnectorRole.WORKER) is None
    assert getattr(shm_broadcast.SpinCondition.wait, "_pd_parks", False)  # the worker parks instead
    assert idle_steps(_vllm_config("kv_consumer", {"idle_pause_s": 0.03}), KVConnectorRole.SCHEDULER) is None
    assert idle_steps(_vllm_config("kv_producer", {"idle_pause_s": 0.0}), KVConnectorRole.SCHEDULER) is None


def test_the_setting_reaches_the_prefill_connector():
    from types import SimpleNamespace

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from pipeline.config import compose
    from pipeline.engine.build import kv_transfer_config

    for offload in ("none", "dram"):
        cfg = compose(["+job=summarize", "transport.prefill_idle_pause_ms=7.5", f"offload={offload}"])
        prefill = SimpleNamespace(kv_transfer_config=kv_transfer_config(cfg, "prefill"))
        decode = SimpleNamespace(kv_transfer_config=kv_transfer_config(cfg, "decode"))
        assert idle_steps(prefill, KVConnectorRole.SCHEDULER).pause_s == pytest.approx(0.0075)
        assert idle_steps(decode, KVConnectorRole.SCHEDULER) is None


def test_a_parked_worker_sleeps_until_notified():
    """After park_between_steps, a reader of vLLM's shared-memory queue that was told the engine
    is paced (set_parked) no longer spins for a second after each read (SpinCondition.busy_loop_s):
    its wait blocks on the ZeroMQ notification, here for its whole timeout since nothing
    notifies it (a spinning wait returns at once, as it still does when not parked)."""
    import time

    import zmq
    from vllm.distributed.device_communicators import shm_broadcast

    from pipeline.engine.idle import park_between_steps, set_parked

    ctx = zmq.Context()
    # The writer binds the notification address first, as in vLLM: a reader connected to an
    # inproc address nobody bound made the context's teardown abort the whole test process now
    # and then (libzmq asserts on the pending connection).
    writer = shm_broadcast.SpinCondition(False, ctx, "inproc://pd-test-park")
    reader = shm_broadcast.SpinCondition(True, ctx, "inproc://pd-test-park")
    try:
        reader.record_read()
        t0 = time.monotonic()
        reader.wait(timeout_ms=200)
        assert time.monotonic() - t0 < 0.05  # vLLM's way: just read, so it yields and returns
        park_between_steps()
        park_between_steps()  # idempotent
        reader.record_read()
        t0 = time.monotonic()
        reader.wait(timeout_ms=200)
        assert time.monotonic() - t0 < 0.05  # a step with work came last: spins as vLLM does
        set_parked(True)  # the scheduler paused before this step: the engine only holds KV
        reader.record_read()
        t0 = time.monotonic()
        reader.wait(timeout_ms=200)
        assert time.monotonic() - t0 >= 0.15 and reader.busy_loop_s == 1.0  # parked, vLLM's setting kept
    finally:
        set_parked(False)
        for sock in (reader.local_notify_socket, reader.read_cancel_socket, reader.write_cancel_socket,
                     writer.local_notify_socket):
            sock.close(linger=0)
        ctx.term()
