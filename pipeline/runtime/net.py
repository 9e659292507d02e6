"""Addresses and ports a worker binds on its node (NIXL side channel, control socket)."""

from __future__ import annotations

import socket

from pipeline.config import Config


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
    """Where this worker binds: the address of ``transport.interface`` when set, else
    ``transport.host`` when set, else loopback for local runs and this node's address (its host
    name resolved) on a cluster, never ``localhost`` there: peers on other nodes connect to it."""
    if cfg.transport.interface:
        return interface_address(cfg.transport.interface)
    if cfg.transport.host:
        return cfg.transport.host
    if cfg.cluster.launcher == "local":
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def side_channel_port(cfg: Config, slot: int, host: str) -> int:
    """This worker's NIXL side-channel port: ``transport.base_port + 10 x slot`` when a base is
    configured (room for TP ranks), else a free port."""
    return cfg.transport.base_port + 10 * slot if cfg.transport.base_port else free_port(host)
