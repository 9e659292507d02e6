"""Failpoints: faults the fault-injection tests switch on in real workers, each with one
environment variable, and inert unless it is set (unset, empty or ``0``: the production path).

The workers read them through the functions here and never from ``os.environ`` themselves, so
every fault a test can inject is in this one module (and in docs/development.md, "Failpoints"):

- :data:`DECODE_START_DELAY_S` (:func:`decode_start_delay_s`): a decode worker sleeps this many
  seconds before it starts its engine (one that comes up late, or never within
  ``transport.connect_timeout_s``);
- :data:`KV_FAULTS` (:func:`kv_faults`): a decode worker breaks the KV transfer of the first N
  hand-offs it takes over NIXL, for real (``pipeline.roles.decode.DecodeServer._nixl_params``);
- :data:`KV_SKIPS` (:func:`kv_skips`): a decode worker serves the next N hand-offs it takes over
  NIXL (after those :data:`KV_FAULTS` breaks) without loading their KV, so vLLM computes their
  prompts on decode: KV that silently did not arrive (:mod:`pipeline.roles.recompute`);
- :data:`PREFILL_START_DELAY_S` (:func:`prefill_start_delay_s`): a prefill worker sleeps this
  many seconds after its first claim, before it starts its engine (a prefill pool that runs
  short: what ``pools.elastic`` decode ranks make up for);
- :data:`DECODE_KILL_AFTER_ROWS` (:func:`decode_kill_after_rows`): a ``pools.elastic`` decode
  rank kills itself (SIGKILL) once N rows of its own units are served (a decode rank lost while
  it serves units);
- :data:`PREFILL_FREEZE_S` (:func:`prefill_freeze_s`, :func:`freeze_children`): after its second
  prefill a prefill worker stops its engine's processes for this many seconds (SIGSTOP, then
  SIGCONT), as on a hung node.

A value that is not a number, or is negative, raises :class:`ValueError` naming the variable:
a test that meant to inject a fault must not run without it.
"""

from __future__ import annotations

import asyncio
import os
import signal

DECODE_START_DELAY_S = "PD_PIPELINE_INJECT_DECODE_START_DELAY_S"
DECODE_KILL_AFTER_ROWS = "PD_PIPELINE_INJECT_DECODE_KILL_AFTER_ROWS"
KV_FAULTS = "PD_PIPELINE_INJECT_KV_FAULTS"
KV_SKIPS = "PD_PIPELINE_INJECT_KV_SKIPS"
PREFILL_FREEZE_S = "PD_PIPELINE_INJECT_PREFILL_FREEZE_S"
PREFILL_START_DELAY_S = "PD_PIPELINE_INJECT_PREFILL_START_DELAY_S"

#: Every failpoint's environment variable -> what setting it does.
FAILPOINTS = {
    DECODE_START_DELAY_S: "seconds a decode worker sleeps before it starts its engine",
    DECODE_KILL_AFTER_ROWS: "a pools.elastic decode rank kills itself (SIGKILL) once N rows of its own units are served",
    KV_FAULTS: "the first N hand-offs a decode worker takes over NIXL never get their KV",
    KV_SKIPS: "the next N hand-offs a decode worker takes over NIXL are served without loading their KV",
    PREFILL_FREEZE_S: "seconds a prefill worker's engine processes stop after its second prefill",
    PREFILL_START_DELAY_S: "seconds a prefill worker sleeps after its first claim, before it starts its engine",
}


def _number(name: str, kind: type[int] | type[float]) -> int | float:
    """The value of failpoint ``name`` as ``kind``; 0 when it is unset or empty.

    Raises:
        ValueError: the value is not a ``kind`` or is negative.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return kind(0)
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not {'an integer' if kind is int else 'a number'}") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must not be negative")
    return value


def decode_start_delay_s() -> float:
    """Seconds a decode worker waits before it starts its engine (:data:`DECODE_START_DELAY_S`;
    0.0 unless set).

    Raises:
        ValueError: the variable is set to something other than a non-negative number.
    """
    return float(_number(DECODE_START_DELAY_S, float))


def decode_kill_after_rows() -> int:
    """Rows of its own units (``pools.elastic``) a decode rank serves before it kills itself
    with SIGKILL (:data:`DECODE_KILL_AFTER_ROWS`; 0 unless set: never).

    Raises:
        ValueError: the variable is set to something other than a non-negative integer.
    """
    return int(_number(DECODE_KILL_AFTER_ROWS, int))


def prefill_start_delay_s() -> float:
    """Seconds a prefill worker waits after its first claim before it starts its engine
    (:data:`PREFILL_START_DELAY_S`; 0.0 unless set).

    Raises:
        ValueError: the variable is set to something other than a non-negative number.
    """
    return float(_number(PREFILL_START_DELAY_S, float))


def kv_faults() -> int:
    """How many of its first hand-offs over NIXL a decode worker breaks (:data:`KV_FAULTS`; 0
    unless set).

    Raises:
        ValueError: the variable is set to something other than a non-negative integer.
    """
    return int(_number(KV_FAULTS, int))


def kv_skips() -> int:
    """How many hand-offs over NIXL a decode worker serves without loading their KV, after
    those :func:`kv_faults` breaks (:data:`KV_SKIPS`; 0 unless set).

    Raises:
        ValueError: the variable is set to something other than a non-negative integer.
    """
    return int(_number(KV_SKIPS, int))


def prefill_freeze_s() -> float:
    """Seconds a prefill worker's engine processes stop after its second prefill
    (:data:`PREFILL_FREEZE_S`; 0.0 unless set).

    Raises:
        ValueError: the variable is set to something other than a non-negative number.
    """
    return float(_number(PREFILL_FREEZE_S, float))


def freeze_children(seconds: float) -> None:
    """Stop this process's descendants (an engine core and its model worker) with SIGSTOP and
    continue them ``seconds`` seconds later on the running event loop, as on a hung node: the KV
    they hold is not served meanwhile over a transport that needs the prefill side (TCP), while
    this process goes on. Must be called from a running event loop.

    Raises:
        RuntimeError: no running event loop.
    """
    import psutil

    loop = asyncio.get_running_loop()
    procs = psutil.Process().children(recursive=True)
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)

    def thaw() -> None:
        for proc in procs:
            try:
                proc.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass

    loop.call_later(seconds, thaw)
