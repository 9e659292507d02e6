"""Idle steps of a prefill engine that holds KV for decode workers.

A prefill engine whose requests have all finished still holds their KV until the decode workers
have it (vLLM's NIXL connectors: until decode has READ it, or the prefill worker's WRITE is
done; the DRAM tier: until the write into the tier is done). vLLM keeps stepping such an engine
(``Scheduler.has_requests``) so that its connector can see the transfers end, with a 1 ms pause
between steps that computed nothing (``EngineCore._process_engine_step``): about a thousand
empty steps a second (BENCHMARKS.md, "A prefill engine holding KV": with its model worker,
below, a whole core).

:class:`IdleSteps` lets the scheduler-side connector pace those steps: after ``grace_s`` seconds
in which no step computed a token or had transfer work to post, each further empty step pauses
``pause_s`` seconds. The first steps after a prefill (where the connector posts writes and
matches decode's registrations) run at vLLM's pace; a long hold costs one empty step per
``pause_s``. A new request waits at most ``pause_s`` (plus one empty step) for its first step.

Pacing the engine's steps is half of it: between two steps the model-worker process waits for
the next one in vLLM's shared-memory message queue, where it spins (``sched_yield``) for one
second after every read (``SpinCondition.busy_loop_s``) before it parks on a ZeroMQ
notification. With a step every ``pause_s`` it would never park, and spins at a whole core.
:func:`park_between_steps` makes a prefill model worker park at once instead, while the
engine is paced: the scheduler-side connector marks the metadata of a step it paused before
(``pd_park``) and the worker-side connector passes the mark on (:func:`set_parked`); the next
step with work clears it. The engine core notifies the queue's readers with every step it sends
(``MessageQueue.enqueue``), so a parked worker wakes on the next step. Parking at every step
instead (busy or not) made the prefill engine's busy steps ~2x slower on the test machine, so
the worker spins as vLLM does whenever the engine has work.

``idle_pause_s`` in ``kv_connector_extra_config`` (``transport.prefill_idle_pause_ms``) sets
``pause_s``; 0 turns pacing (and parking) off. Decode engines are not paced: their empty steps
are waits for KV, where every millisecond is hand-off time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: Seconds an engine may step at vLLM's pace after its last step with work (tokens or transfers).
IDLE_GRACE_S = 0.05
#: Seconds each empty step pauses after that.
IDLE_PAUSE_S = 0.04


def idle_steps(vllm_config, role) -> "IdleSteps | None":
    """The pacing of a scheduler-side connector of a prefill engine (``kv_producer``) built
    with ``vllm_config``; None for other roles, worker-side connectors, or a pause of 0. For
    the worker-side connector of a paced engine it calls :func:`park_between_steps` (in the
    model-worker process) and returns None."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    if not is_paced(vllm_config):
        return None
    if role == KVConnectorRole.WORKER:
        park_between_steps()
        return None
    return IdleSteps(pause_s=float(vllm_config.kv_transfer_config.get_from_extra_config("idle_pause_s", IDLE_PAUSE_S)))


def is_paced(vllm_config) -> bool:
    """Whether engines built with ``vllm_config`` pace their empty steps: prefill engines
    (``kv_producer``) with an ``idle_pause_s`` above 0."""
    kv = vllm_config.kv_transfer_config
    return kv.kv_role == "kv_producer" and float(kv.get_from_extra_config("idle_pause_s", IDLE_PAUSE_S)) > 0


#: Whether this process's model worker is to park between steps now (set per step from the
#: connector metadata, :func:`set_parked`).
_parked = False


def set_parked(parked: bool) -> None:
    """Worker side, per step: park between steps from now on (the scheduler paused before this
    step: the engine only holds KV) or spin as vLLM does (a step with work)."""
    global _parked
    _parked = bool(parked)


def park_between_steps() -> None:
    """In this process (a prefill engine's model worker), wait for the next engine step parked on
    the message queue's notification instead of spinning, while :func:`set_parked` says so (see
    the module doc); otherwise vLLM's wait, unchanged. Idempotent."""
    from vllm.distributed.device_communicators import shm_broadcast

    cond = shm_broadcast.SpinCondition
    if getattr(cond.wait, "_pd_parks", False):
        return
    spin_wait = cond.wait

    def wait(self, timeout_ms=None):
        if not (_parked and self.is_reader and self.busy_loop_s):
            return spin_wait(self, timeout_ms)
        busy, self.busy_loop_s = self.busy_loop_s, 0.0
        try:
            return spin_wait(self, timeout_ms)
        finally:
            self.busy_loop_s = busy

    wait._pd_parks = True
    cond.wait = wait


@dataclass
class IdleSteps:
    """Paces empty engine steps (see the module doc). ``pause_s`` seconds per empty step once
    ``grace_s`` seconds have passed since the last step with work; ``clock`` and ``sleep`` are
    ``time.monotonic`` / ``time.sleep`` (replaceable in tests)."""

    grace_s: float = IDLE_GRACE_S
    pause_s: float = IDLE_PAUSE_S
    clock: object = time.monotonic
    sleep: object = time.sleep
    last_work: float = field(default=0.0)
    paused_s: float = 0.0  # total seconds paused (for tests and metrics)

    def step(self, scheduled_tokens: int, transfer_work: bool) -> float:
        """Called once per engine step by the scheduler-side connector, with the tokens the step
        schedules and whether it carries transfer work; returns the seconds it paused."""
        now = self.clock()
        if scheduled_tokens > 0 or transfer_work:
            self.last_work = now
            return 0.0
        if now - self.last_work < self.grace_s:
            return 0.0
        self.sleep(self.pause_s)
        self.paused_s += self.pause_s
        return self.pause_s
