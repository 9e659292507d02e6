"""The NIXL side-channel port a worker binds on its node: reserved before its engine starts and
watched while it starts (where the worker binds: :mod:`pipeline.runtime.addresses`).

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pipeline.config import Config
from pipeline.runtime.addresses import worker_host
from pipeline.runtime.port_watch import ForeignListenerWatch, holder

log = logging.getLogger(__name__)
T = TypeVar("T")


class PortInUseError(ValueError):
    """A port a worker must bind (its NIXL side channel) is taken by another process. The message
    is one line naming the port, the host and the setting (``transport.base_port``)."""


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


def _setting(cfg: Config, slot: int) -> str:
    if cfg.transport.base_port:
        return (f"transport.base_port={cfg.transport.base_port} + 10 x worker slot {slot}; "
                f"stop that process or choose another transport.base_port (0 picks free ports)")
    return ("a free port picked with transport.base_port=0 and taken before vLLM bound it; "
            "run the worker again")


def _taken_message(cfg: Config, slot: int, host: str, port: int) -> str:
    return (f"NIXL side-channel port {port} on {host} is in use by another process"
            f"{holder(host, port)} ({_setting(cfg, slot)})")


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
    watch = ForeignListenerWatch(host, port, watch_interval_s)
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
