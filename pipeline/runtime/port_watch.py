"""Who listens on a port, and a watch that ends an engine's start when another process takes the
port the engine is about to bind (see :mod:`pipeline.runtime.ports`)."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

_WILDCARDS = {"0.0.0.0", "::", ""}


def listeners(host: str, port: int) -> list:
    """TCP sockets listening on ``port`` at ``host`` or a wildcard address (psutil connections)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return [c for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            and (c.laddr.ip == host or c.laddr.ip in _WILDCARDS or host in _WILDCARDS
                 or c.laddr.ip == f"::ffff:{host}")]


def holder(host: str, port: int) -> str:
    """``" (pid N, NAME)"`` for the process listening on ``host:port`` when it can be told."""
    import psutil

    for c in listeners(host, port):
        if c.pid:
            try:
                return f" (pid {c.pid}, {psutil.Process(c.pid).name()})"
            except psutil.Error:
                return f" (pid {c.pid})"
    return ""


class ForeignListenerWatch:
    """A thread that, every ``interval_s`` seconds, looks for a process other than this one and
    its descendants listening on ``host:port``; on finding one it records it and from then on
    kills the processes this one started since the watch began (the engine being built, and
    any it starts later) until stopped. It stops looking once one of ours listens there (vLLM
    bound the port)."""

    def __init__(self, host: str, port: int, interval_s: float):
        import psutil

        self.host, self.port, self.interval_s = host, port, interval_s
        self.me = psutil.Process()
        self.before = {p.pid for p in self._descendants()}
        self.taken_by: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"side-channel-watch-{port}", daemon=True)
        self._thread.start()

    def _descendants(self) -> list:
        import psutil

        try:
            return self.me.children(recursive=True)
        except psutil.Error:
            return []

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.taken_by is not None:
                self._kill_new()  # an engine process started after the port was found taken
                continue
            listening = listeners(self.host, self.port)
            if not listening:
                continue
            owned = [self._ours(c.pid) for c in listening]
            if any(o is True for o in owned):
                return  # vLLM bound it: nothing more can go wrong with this port
            if any(o is None for o in owned):
                continue  # the listener exited meanwhile: look again
            self.taken_by = holder(self.host, self.port)
            log.error("NIXL side-channel port %d on %s was taken by another process%s while the engine "
                      "started; stopping the engine", self.port, self.host, self.taken_by)
            self._kill_new()

    def _ours(self, pid: int | None) -> bool | None:
        """Whether ``pid`` is this process or one of its descendants, by its own ancestry: a walk
        of our children can miss one (a process whose parent exits during the walk is not
        reached, and vLLM's start-up runs short-lived children) or fail, and then our own
        engine's listener would look foreign. None when ``pid`` is gone."""
        import psutil

        if pid is None:  # not ours to see: another user's process
            return False
        if pid == self.me.pid:
            return True
        try:
            return any(a.pid == self.me.pid for a in psutil.Process(pid).parents())
        except psutil.NoSuchProcess:
            return None
        except psutil.Error:
            return False

    def _kill_new(self) -> None:
        import psutil

        new = [p for p in self._descendants() if p.pid not in self.before]
        for p in reversed(new):  # children before their parents
            try:
                p.kill()
            except psutil.Error:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
