"""Where a worker binds and what it advertises to its peers: an interface's address, this node's
routable address, or loopback for local runs."""

from __future__ import annotations

import logging
import socket

from pipeline.config import Config

log = logging.getLogger(__name__)


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
