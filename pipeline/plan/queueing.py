"""Queueing formulas: the M/D/1 and M/G/1 waits of a prefill worker (Pollaczek-Khinchine), and
the M/M/c (Erlang C) wait and number in system of a decode worker's slots."""

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


def mmc_in_system(servers: int, offered: float, upto: int) -> list[float]:
    """``P(N = n)`` for ``n < upto``: the number of requests in an M/M/c system (waiting or
    served), ``c`` = ``servers``, ``a`` = ``offered`` erlangs, ``rho = a / c``:
    ``P(n) = p0 a^n / n!`` for ``n < c``, ``p0 a^c / c! rho^(n - c)`` for ``n >= c``, with
    ``p0 = 1 / (sum_{n<c} a^n / n! + a^c / c! / (1 - rho))`` (Kleinrock 1975, sec. 3.5).

    Raises:
        ValueError: as :func:`erlang_c`.
    """
    erlang_c(servers, offered)  # the same checks
    rho = offered / servers
    terms, t = [], 1.0
    for n in range(servers + 1):  # a^n / n!, n = 0..c
        terms.append(t)
        t *= offered / (n + 1)
    p0 = 1 / (sum(terms[:servers]) + terms[servers] / (1 - rho))
    return [p0 * (terms[n] if n < servers else terms[servers] * rho ** (n - servers)) for n in range(upto)]


def dram_full_probability(servers: int, offered: float, upstream: float, room: int) -> float:
    """Probability that a request reserving DRAM-tier slots at a decode worker finds ``room`` or
    more requests holding slots there (so its prefill has to wait): ``P(Nu + Ns >= room)``.
    ``Ns``, the requests at the decode worker's ``servers`` KV-cache slots (waiting for one or
    decoding in one), has the M/M/c distribution :func:`mmc_in_system`; ``Nu``, those reserved
    upstream (queued for or in prefill, being pushed), is Poisson with mean ``upstream``
    (M/G/inf); the two are taken as independent. Poisson arrivals see these time averages
    (PASTA).

    Raises:
        ValueError: as :func:`erlang_c`.
    """
    if room <= 0:
        return 1.0
    ps = mmc_in_system(servers, offered, room)
    pu, term = [], math.exp(-upstream)
    for i in range(room):
        pu.append(term)
        term *= upstream / (i + 1)
    below = sum(ps[j] * pu[total - j] for total in range(room) for j in range(total + 1))
    return min(1.0, max(0.0, 1 - below))


def batch_ttft(rows: int, in_flight: int, service_s: float, handoff_s: float, after_s: float,
               throughput: float) -> tuple[float, float]:
    """(mean, median) TTFT in seconds of a batch of ``rows`` requests served by one prefill
    engine that keeps at most ``in_flight`` of them in flight (the pipeline's ``job.batch_rows``
    per worker): all are there at the start; a request holds its place from entering prefill
    until its last token, then the next one enters (a closed system of ``b = min(in_flight,
    rows)`` customers). ``service_s`` = S, the engine's seconds per request; ``handoff_s`` = H,
    prefill end to first token; ``after_s`` = D, first token to last (decoding); ``throughput`` =
    X, requests/s the engine completes in the steady state.

    - The first ``b`` enter together and the engine prefills them first come first served
      (vLLM's scheduler, one request's prompt after another within and across steps), so the
      ``j``-th has its first token at ``TTFT_j = j S + H``, ``j = 1..b``: rows ahead of it in the
      batch, its own prefill, the hand-off.
    - Each later one enters as one leaves. By Little's law on the closed loop (the response time
      law ``R = N / X - Z``, Lazowska et al. 1984, "Quantitative System Performance", ch. 3,
      with ``N = b`` customers and the decoding as think time ``Z = D``), ``TTFT = b / X - D``,
      and at least ``S + H`` (nothing ahead). With a prefill-bound engine (``X = 1 / S``) this
      is ``b S - D``: the rows in flight that are not decoding are all queued for prefill.

    The median is taken over the ``rows`` values (``b`` of the first kind, ``rows - b`` of the
    second), the middle two averaged, as ``numpy.percentile``'s linear p50.

    Raises:
        ValueError: ``rows`` or ``in_flight`` < 1, or ``throughput <= 0``.
    """
    if rows < 1 or in_flight < 1:
        raise ValueError(f"rows and rows in flight must be >= 1, got {rows} and {in_flight}")
    if not throughput > 0:
        raise ValueError(f"throughput must be > 0 requests/s, got {throughput}")
    b = min(in_flight, rows)
    steady = max(service_s + handoff_s, b / throughput - after_s)
    first = [j * service_s + handoff_s for j in range(1, b + 1)]
    mean = (sum(first) + (rows - b) * steady) / rows
    ordered = sorted(first + [steady] * (rows - b))
    mid = rows // 2
    return mean, ordered[mid] if rows % 2 else (ordered[mid - 1] + ordered[mid]) / 2
