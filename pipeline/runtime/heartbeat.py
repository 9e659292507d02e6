"""A heartbeat written from its own thread, so that it says "this process is alive" whatever its
event loop is doing.

A decode rank's heartbeat used to be an asyncio task of its worker, so a loop held up by a long
callback (vLLM's output handler and stat loggers run there after each engine step) held the
heartbeat too, and a rank still serving could read as lost after ``transport.decode_dead_after_s``.
Whether a rank *answers* is told by its acknowledgments instead
(:class:`pipeline.roles.router.DecodeRouter`, ``ack_timeout_s``). A thread does not help a process
the kernel gives no CPU at all: that was the test Slurm's "lost" ranks (BENCHMARKS.md, "Again,
each worker on its engine's cores"; :func:`pipeline.engine.env.worker_pin`)."""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class Heartbeat:
    """Call ``beat`` every ``every_s`` seconds from a daemon thread named ``name``, from
    :meth:`start` until :meth:`stop`. A beat that raises ``OSError`` (a file system hiccup) is
    skipped: the next one tries again. ``beat`` runs on that thread, so what it reads of objects
    the event loop changes must be safe to read from another thread (``len`` of a dict, a sum
    over a snapshot).

    :meth:`poke` asks for a beat now rather than at the next tick (what it publishes changed),
    at most one every ``min_gap_s`` seconds: pokes in between are answered by one beat."""

    def __init__(self, beat: Callable[[], None], every_s: float, name: str, min_gap_s: float = 0.2):
        self._beat, self.every_s, self.min_gap_s = beat, every_s, min(min_gap_s, every_s)
        self._stopped, self._poked = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def poke(self) -> None:
        """Beat soon (within ``min_gap_s`` of the last beat), from any thread."""
        self._poked.set()

    def _loop(self) -> None:
        while True:
            self._poked.wait(max(0.0, self.every_s - self.min_gap_s))  # every every_s with no poke
            if self._stopped.is_set():
                return
            self._poked.clear()
            try:
                self._beat()
            except OSError as exc:
                log.debug("heartbeat %s: %s; the next beat tries again", self._thread.name, exc)
            if self._stopped.wait(self.min_gap_s):
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop beating and wait up to ``timeout_s`` seconds for a beat in progress to end (so
        that a last beat written after it, such as "stopped", is not overwritten)."""
        self._stopped.set()
        self._poked.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
