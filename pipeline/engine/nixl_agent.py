"""NIXL agents whose progress thread sleeps between events instead of spinning.

NIXL's Python ``nixl_agent`` always creates its C++ agent with ``pthrDelay = 0``: the UCX
backend's progress thread then calls ``poll()`` on UCX's event descriptors with a zero timeout,
in a loop, and takes a whole core even when nothing moves. On a node where each worker has one
core (the colocated-vs-disaggregated comparison in ``tools/bench.py``), that thread takes
0.5-0.8 of the core the model runs on (BENCHMARKS.md, "Fix: NIXL's progress thread sleeps instead of spinning"). With a positive delay the thread
blocks in ``poll()`` for up to that many microseconds and wakes at once when UCX signals
an event, so transfers still progress in the background.

The delay is not exposed by ``nixl_agent_config``; :func:`with_progress_delay` supplies it at
the one place the Python API builds the C++ agent.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

#: The delay an agent gets where none is given: the progress thread waits up to 1 ms (1000 us) for a
#: UCX event. The pipeline's engines get theirs from the config (on a GPU this one, on a CPU
#: longer: :func:`pipeline.engine.build.progress_delay_us`).
DEFAULT_PTHR_DELAY_US = 1000

_lock = threading.Lock()


class _BindingsWithDelay:
    """Stands in for ``nixl._api``'s ``nixlBind`` module: identical, except that the agent it
    builds gets ``pthrDelay = delay_us``."""

    def __init__(self, bindings, delay_us: int):
        self._bindings = bindings
        self._delay_us = delay_us

    def __getattr__(self, name):
        return getattr(self._bindings, name)

    def nixlAgent(self, name, config):  # noqa: N802 (NIXL's name)
        config.pthrDelay = self._delay_us
        return self._bindings.nixlAgent(name, config)


@contextlib.contextmanager
def with_progress_delay(delay_us: int = DEFAULT_PTHR_DELAY_US) -> Iterator[None]:
    """Within this block, every ``nixl_agent(...)`` built in this process gets a progress thread
    that waits up to ``delay_us`` microseconds per ``poll()`` (0 = NIXL's own busy loop).

    Raises ValueError for a negative delay."""
    if delay_us < 0:
        raise ValueError(f"progress-thread delay must be >= 0 us, got {delay_us}")
    import nixl._api as api

    with _lock:
        real = api.nixlBind
        api.nixlBind = _BindingsWithDelay(real, delay_us)
        try:
            yield
        finally:
            api.nixlBind = real
