"""Addresses and ports a worker binds on its node (NIXL side channel, control socket).

The NIXL side channel is bound by vLLM, not by us: its connector's scheduler (in the engine-core
process) starts a thread that binds a ZeroMQ ROUTER on ``VLLM_NIXL_SIDE_CHANNEL_HOST:PORT``
(``NixlBaseConnectorScheduler._nixl_handshake_listener``, vLLM 0.32) and waits on an event that
thread sets once bound. When the bind fails (the port is taken) the thread dies with a
``ZMQError`` and the engine core waits on that event forever: the worker hangs until vLLM's
``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s) and nothing names the port. vLLM takes only a port
number for this socket (no ``bind_to_random_port``, no inherited listener), so
:func:`side_channel` (the one way a worker gets its port) makes both failure kinds fast instead:

- the port is *reserved* before the engine starts: bound here with ``SO_REUSEADDR`` and not
  listening. A port that is taken (a fixed ``transport.base_port``) fails that bind at once,
  before any engine starts. A reserved port stays ours until vLLM binds it: the kernel hands it
  to no other ``bind(port 0)`` (free-port pickers, pyzmq's ``bind_to_random_port``, vLLM's
  ``get_open_port``), which leaves no race between picking a free port and vLLM binding it for
  those; libzmq's own bind sets ``SO_REUSEADDR`` too, so vLLM binds the reserved port (Linux lets
  reuse-address sockets share a port while at most one of them listens).
- while the engine starts, a watch looks for a listener on the port that is not this process or
  one of its children (someone who bound the port explicitly in between). vLLM's bind then has
  failed or will fail, so the watch ends the engine's new processes: vLLM's start-up sees its
  engine core die and raises at once, and :func:`side_channel` raises :class:`PortInUseError`
  naming the port, host and setting instead of vLLM's message.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pipeline.config import Config

log = logging.getLogger(__name__)
T = TypeVar("T")

_WILDCARDS = {"0.0.0.0", "::", ""}


class PortInUseError(ValueError):
    """A port a worker must bind (its NIXL side channel) is taken by another process. The message
    is one line naming the port, the host and the setting (``transport.base_port``)."""


def interface_address(interface: str) -> str:
    """The IPv4 address of network interface ``interface`` (``ib0``, ``eth0``).

    Raises:
        ValueError: the interface does not exist here or has no IPv4 address.
    """
    import psutil

    addrs = psutil.net_if_addrs()
    if interface not in addrs:
        raise ValueError(f"transport.interface: no interface {interface!r} on {socket.gethostname()} "
                         f"(have: {', '.join(sorted(addrs))})")
    for a in addrs[interface]:
        if a.family == socket.AF_INET:
            return a.address
    raise ValueError(f"transport.interface: {interface!r} has no IPv4 address")


def worker_host(cfg: Config) -> str:
    """Where this worker binds and what it advertises to its peers (NIXL side channel, control
    socket): the address of ``transport.interface`` when set, else ``transport.host`` when set,
    else loopback for local runs and this node's routable address on a cluster
    (:func:`node_address`), never a loopback one there: peers on other nodes connect to it.

    Raises:
        ValueError: on a cluster, no routable address can be told (see :func:`node_address`),
            or ``transport.interface`` does not exist here.
    """
    if cfg.transport.interface:
        return interface_address(cfg.transport.interface)
    if cfg.transport.host:
        return cfg.transport.host
    if cfg.cluster.launcher == "local":
        return "127.0.0.1"
    return node_address()


def _is_loopback(address: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(address).is_loopback


def node_address() -> str:
    """This node's IPv4 address for peers on other nodes: its host name resolved, unless that is a
    loopback address (Debian's ``/etc/hosts`` maps the host's own name to ``127.0.1.1``; a peer
    that connects there reaches itself) or does not resolve; then the one IPv4 address of an
    interface that is up and not loopback.

    Raises:
        ValueError: the name resolves to loopback (or not at all) and this node has no such
            interface, or several (the message names them: set ``transport.interface``).
    """
    import psutil

    name = socket.gethostname()
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        resolved = None
    if resolved and not _is_loopback(resolved):
        return resolved
    stats = psutil.net_if_stats()
    found = {iface: a.address for iface, addrs in psutil.net_if_addrs().items()
             if iface in stats and stats[iface].isup
             for a in addrs if a.family == socket.AF_INET and not _is_loopback(a.address)}
    why = (f"host name {name!r} resolves to {resolved}, a loopback address peers on other nodes cannot reach"
           if resolved else f"host name {name!r} does not resolve")
    if len(found) == 1:
        (iface, address), = found.items()
        log.warning("%s; advertising %s of %s instead (transport.interface=%s says so explicitly)",
                    why, address, iface, iface)
        return address
    have = ", ".join(f"{i} {a}" for i, a in sorted(found.items())) or "none up"
    raise ValueError(f"{why}, and this node has "
                     f"{'several' if found else 'no'} other IPv4 interfaces ({have}): set "
                     f"transport.interface (e.g. ib0) or transport.host")


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now (nothing holds it afterwards: prefer
    :func:`reserve_port`, which keeps it until the real bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def side_channel_port(cfg: Config, slot: int) -> int:
    """The NIXL side-channel port configured for worker slot ``slot`` (decode rank ``r`` is slot
    ``r``, prefill task ``i`` is slot ``pools.decode + i``): ``transport.base_port + 10 x slot``,
    or 0 (a free port, picked by :func:`side_channel`) when ``transport.base_port`` is 0."""
    return cfg.transport.base_port + 10 * slot if cfg.transport.base_port else 0


def uses_side_channel(cfg: Config) -> bool:
    """Whether this run's engines bind a NIXL side channel: ``pools=disaggregated`` with vLLM's
    NIXL connectors. Colocated engines have no connector; the DRAM tier's connector
    (``offload=dram``, :mod:`pipeline.engine.dram_connector`) has its own NIXL agents and no
    side channel."""
    return cfg.pools.mode == "disaggregated" and not cfg.offload.dram(cfg.model.max_model_len)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind a TCP socket to ``host:port`` (``port`` 0: a free port) with ``SO_REUSEADDR``, without
    listening, and return it: while it is open no ``bind(port 0)`` gets that port, and a
    ZeroMQ/libzmq bind of the same port (which sets ``SO_REUSEADDR``) still succeeds. Close it
    once the real owner has bound the port. The caller's process only: the socket is not
    inherited by child processes.

    Raises:
        OSError: the bind failed (``errno.EADDRINUSE``: another process listens on the port or
            holds it without ``SO_REUSEADDR``).
    """
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s


def _listeners(host: str, port: int) -> list:
    """TCP sockets listening on ``port`` at ``host`` or a wildcard address (psutil connections)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return [c for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            and (c.laddr.ip == host or c.laddr.ip in _WILDCARDS or host in _WILDCARDS
                 or c.laddr.ip == f"::ffff:{host}")]


def _holder(host: str, port: int) -> str:
    """``" (pid N, NAME)"`` for the process listening on ``host:port`` when it can be told."""
    import psutil

    for c in _listeners(host, port):
        if c.pid:
            try:
                return f" (pid {c.pid}, {psutil.Process(c.pid).name()})"
            except psutil.Error:
                return f" (pid {c.pid})"
    return ""


def _setting(cfg: Config, slot: int) -> str:
    if cfg.transport.base_port:
        return (f"transport.base_port={cfg.transport.base_port} + 10 x worker slot {slot}; "
                f"stop that process or choose another transport.base_port (0 picks free ports)")
    return ("a free port picked with transport.base_port=0 and taken before vLLM bound it; "
            "run the worker again")


def _taken_message(cfg: Config, slot: int, host: str, port: int) -> str:
    return (f"NIXL side-channel port {port} on {host} is in use by another process"
            f"{_holder(host, port)} ({_setting(cfg, slot)})")


def check_ports_free(cfg: Config) -> None:
    """Check, before any engine starts, that every worker's NIXL side-channel port is free on
    this host: for local runs (``cluster.launcher == "local"``) with a fixed
    ``transport.base_port``, the ports ``base_port + 10 x slot`` of every decode rank and prefill
    task on :func:`worker_host`. Nothing is checked when the engines bind no side channel
    (:func:`uses_side_channel`), with ``base_port`` 0 (free ports are picked at start) or on a cluster (the
    ports are on other nodes). Binds and closes each port at once (a few ms).

    Raises:
        PortInUseError: (a ``ValueError``) the first taken port, named with the host and
            ``transport.base_port``.
        ValueError: a port cannot be bound for another reason (below 1024 without root; the
            host is not an address of this node), or ``transport.interface`` does not exist here.
    """
    if cfg.cluster.launcher != "local" or not cfg.transport.base_port or not uses_side_channel(cfg):
        return
    host = worker_host(cfg)
    for slot in range(cfg.pools.decode + cfg.pools.prefill):
        port = side_channel_port(cfg, slot)
        try:
            reserve_port(host, port).close()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ValueError(f"transport.base_port={cfg.transport.base_port}: cannot bind port {port} "
                                 f"on {host}: {exc.strerror}") from None
            raise PortInUseError(f"{_taken_message(cfg, slot, host, port)}: {exc.strerror}") from None


class _ForeignListenerWatch:
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
            listening = _listeners(self.host, self.port)
            if not listening:
                continue
            owned = [self._ours(c.pid) for c in listening]
            if any(o is True for o in owned):
                return  # vLLM bound it: nothing more can go wrong with this port
            if any(o is None for o in owned):
                continue  # the listener exited meanwhile: look again
            self.taken_by = _holder(self.host, self.port)
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


@contextmanager
def side_channel(cfg: Config, slot: int, host: str, watch_interval_s: float = 1.0) -> Iterator[int]:
    """The NIXL side-channel port of worker slot ``slot`` on ``host``, held for the engine start
    that runs inside the ``with`` block (pass it to the engine as ``VLLM_NIXL_SIDE_CHANNEL_PORT``)::

        with side_channel(cfg, slot, host) as port:
            engine = build_engine(cfg, role, side_channel=(host, port), ...)

    The port is ``transport.base_port + 10 x slot``, or a free one when ``base_port`` is 0. It
    is reserved (:func:`reserve_port`) until the block ends, so a free port picked here goes to
    no other ``bind(port 0)`` before vLLM binds it; vLLM binds it itself (it offers no way to
    hand it a bound socket), so a port taken in between is caught by a watch
    (every ``watch_interval_s`` seconds) that ends the engine's processes, and this raises.
    See the module docstring. When the engines bind no side channel (:func:`uses_side_channel`)
    this only yields the configured port (a free one with ``base_port`` 0).

    Raises:
        PortInUseError: the port is taken (at once, before the block runs), or another process
            began listening on it while the engine started (within ``watch_interval_s`` seconds;
            the block's own exception, vLLM's "Engine core initialization failed", is the cause).
        OSError: ``host`` is not an address of this node.
    """
    port = side_channel_port(cfg, slot)
    if not uses_side_channel(cfg):  # nothing binds it: nothing to hold or watch
        yield port or free_port(host)
        return
    try:
        reservation = reserve_port(host, port)
    except OSError as exc:
        if port == 0 or exc.errno != errno.EADDRINUSE:
            raise
        raise PortInUseError(f"{_taken_message(cfg, slot, host, port)}: {exc.strerror}") from None
    port = reservation.getsockname()[1]
    watch = _ForeignListenerWatch(host, port, watch_interval_s)
    try:
        yield port
    except BaseException as exc:
        watch.stop()
        if watch.taken_by is not None:
            raise PortInUseError(f"NIXL side-channel port {port} on {host} is in use by another process"
                                 f"{watch.taken_by} ({_setting(cfg, slot)})") from exc
        raise
    finally:
        watch.stop()
        reservation.close()


def start_on_side_channel(cfg: Config, slot: int, host: str, start: Callable[[int], T], attempts: int = 3,
                          watch_interval_s: float = 1.0) -> T:
    """``start(port)`` (an engine start) inside :func:`side_channel`, returning what it returns.
    A port picked free (``transport.base_port`` 0) and lost before vLLM bound it is no fault of
    the run's: the engine is started again on another free port, up to ``attempts`` times in
    all, each loss logged. A fixed port that is taken fails at once.

    Raises:
        PortInUseError: a fixed port taken, or a free one lost ``attempts`` times.
    """
    for attempt in range(1, attempts + 1):
        try:
            with side_channel(cfg, slot, host, watch_interval_s) as port:
                return start(port)
        except PortInUseError as exc:
            if side_channel_port(cfg, slot) != 0 or attempt == attempts:
                raise
            log.warning("%s; starting the engine again on another free port (attempt %d of %d)",
                        exc, attempt + 1, attempts)
    raise AssertionError("unreachable")
