"""Queueing formulas: the M/D/1 and M/G/1 waits of a prefill worker (Pollaczek-Khinchine), and
the M/M/c (Erlang C) wait and queue length of a decode worker's slots."""

from __future__ import annotations

import math
from typing import Sequence


def md1_wait(rho: float, service_s: float) -> float:
    """Mean wait in queue (seconds) of an M/D/1 server: ``rho / (2 mu (1 - rho))``, ``mu =
    1 / service_s`` (Pollaczek-Khinchine with deterministic service; Kleinrock, Queueing
    Systems vol. 1, 1975).

    Raises:
        ValueError: ``rho >= 1`` (the server is overloaded: no steady state) or ``rho < 0``.
    """
    if not 0 <= rho < 1:
        raise ValueError(f"queue overloaded: utilisation {rho:.3g} >= 1" if rho >= 1
                         else f"utilisation must be >= 0, got {rho}")
    return rho / (2 * (1 / service_s) * (1 - rho))


def mg1_wait(rate: float, services: Sequence[float]) -> float:
    """Mean wait in queue (seconds) of an M/G/1 server with Poisson arrivals at ``rate``
    requests/s and service times drawn from ``services`` (seconds): Pollaczek-Khinchine,
    ``Wq = rate E[S^2] / (2 (1 - rho))``, ``rho = rate E[S]``; :func:`md1_wait` when all are
    equal.

    Raises:
        ValueError: ``rho >= 1``.
    """
    es = sum(services) / len(services)
    es2 = sum(s * s for s in services) / len(services)
    rho = rate * es
    if rho >= 1:
        raise ValueError(f"queue overloaded: utilisation {rho:.3g} >= 1")
    return rate * es2 / (2 * (1 - rho))


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (Erlang C) with ``servers`` = c servers
    and offered load ``offered`` = a = lambda x E[service] (erlangs):
    ``C(c, a) = c B / (c - a (1 - B))``, ``B`` the Erlang B blocking probability from the
    recursion ``B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1))`` (Kleinrock, Queueing Systems vol. 1,
    1975, sec. 3.5; the recursion avoids ``a^c / c!``). The mean wait is then ``Wq = C E[service]
    / (c - a)`` and the mean number waiting ``Lq = lambda Wq = C a / (c - a)``.

    Raises:
        ValueError: ``servers < 1`` or not ``0 <= offered < servers`` (no steady state).
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if not 0 <= offered < servers:
        raise ValueError(f"queue overloaded: offered load {offered:.3g} >= {servers} servers" if offered >= servers
                         else f"offered load must be >= 0, got {offered}")
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1 - b))


def dram_full_probability(servers: int, offered: float, transit: float, room: int) -> float:
    """Probability that a request arriving at a decode worker's DRAM pool finds ``room`` or more
    requests there (so its push has to wait): ``P(Nq + Nt >= room)``. ``Nq``, the requests
    waiting for one of ``servers`` slots, has the M/M/c distribution ``P(Nq = 0) = 1 - C rho``,
    ``P(Nq = j) = C (1 - rho) rho^j`` for ``j >= 1`` (``C`` = :func:`erlang_c`, ``rho = offered /
    servers``; Kleinrock 1975, sec. 3.5); ``Nt``, those being pushed or loaded, is Poisson with
    mean ``transit`` (M/G/inf); the two are taken as independent. Poisson arrivals see these
    time averages (PASTA).

    Raises:
        ValueError: as :func:`erlang_c`.
    """
    if room <= 0:
        return 1.0
    c = erlang_c(servers, offered)
    rho = offered / servers
    pq = [1 - c * rho] + [c * (1 - rho) * rho ** j for j in range(1, room)]
    pt, term = [], math.exp(-transit)
    for i in range(room):
        pt.append(term)
        term *= transit / (i + 1)
    below = sum(pq[j] * pt[total - j] for total in range(room) for j in range(total + 1))
    return min(1.0, max(0.0, 1 - below))
