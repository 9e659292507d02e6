"""The decode-worker router of a prefill worker: connections to every decode rank, liveness from
their heartbeats, and the choice of decode worker for each request (admission by KV)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

import msgspec
import zmq
import zmq.asyncio

from pipeline.roles.announce import Announcing
from pipeline.roles.errors import DecodeLost, DecodeUnavailable, DecodeUnreachable, check_fits
from pipeline.runtime.rundir import RunDir
from pipeline.wire.auth import Unauthenticated, sign, verify
from pipeline.wire.messages import (Cancel, Handoff, Message, Probe, Received, Release, Renew, Reserve, Reserved,
                                    Result, decode, encode)

log = logging.getLogger(__name__)


class DecodeRouter(Announcing):
    """Connections to the decode workers. :meth:`handoff` sends to the live worker with the most
    free KV cache and waits for its :class:`Result`. Admission counts KV tokens, not requests:
    a worker's load is the KV its requests in flight will reach (prompt + new tokens each) as a
    fraction of the tokens its KV cache holds (published by the worker at start; the KV in
    flight in its heartbeat, or this worker's hand-offs to it when more: :meth:`load`).

    A monitor re-reads the decode endpoints every second: a worker whose heartbeat (the value in
    its endpoint file, rewritten every 2 s) this process has not seen change for ``dead_after_s``
    seconds is dead, one that published a new endpoint was restarted; either way its in-flight
    hand-offs fail with :class:`DecodeLost` (the caller serves them again) and new hand-offs go
    elsewhere, or wait for it to come back. Liveness is timed with this process's monotonic
    clock from when a change was seen, never by comparing the timestamp the decode node wrote
    with this node's clock: the two nodes' clocks need not agree. A worker first seen counts as
    alive for ``dead_after_s`` seconds.

    A heartbeat goes through the run directory, not over the link between the two nodes, so it
    cannot tell that link is down. Reachability is the worker's own acknowledgment instead: a
    hand-off (or reservation) it has not acknowledged within ``ack_timeout_s`` seconds is
    withdrawn (:class:`~pipeline.wire.messages.Cancel`) and fails with :class:`DecodeUnreachable`
    (the caller serves the row elsewhere); the worker is then unreachable from this process,
    gets no new rows, and is probed every ``ack_timeout_s`` until it answers.
    """

    def __init__(self, run: RunDir, timeout_s: float, dead_after_s: float, secret: bytes,
                 ack_timeout_s: float = 30.0):
        self.run, self.timeout_s, self.dead_after_s, self.secret = run, timeout_s, dead_after_s, secret
        self.ack_timeout_s = ack_timeout_s
        self.ctx = zmq.asyncio.Context()
        self.endpoints: dict[int, str] = {}
        self.sockets: dict[int, zmq.asyncio.Socket] = {}
        self.receivers: dict[int, asyncio.Task] = {}
        # rank -> row key (hand-off) or ("reserve", request id) -> its answer
        self.inflight: dict[int, dict[str | tuple[str, str], asyncio.Future]] = {}
        self.inflight_tokens: dict[int, int] = {}  # rank -> KV tokens its hand-offs in flight reach
        self.capacity: dict[int, int | None] = {}  # rank -> tokens its KV cache holds
        self.dram_capacity: dict[int, int | None] = {}  # rank -> tokens its DRAM tier holds
        # rank -> (rows it decodes, KV tokens they may reach), as its last heartbeat published
        self.published: dict[int, tuple[int, int]] = {}
        # rank -> (rows, KV tokens) of this worker's hand-offs answered since its heartbeat was read (load)
        self.ended: dict[int, tuple[int, int]] = {}
        # rank -> request ids whose DRAM-tier reservation there no hand-off has claimed yet:
        # renewed every quarter of timeout_s (:class:`Renew`) so that the worker keeps them.
        self.reserved: dict[int, set[str]] = {}
        self.live: set[int] = set()
        # rank -> time.monotonic() of its last probe: live ranks that did not acknowledge a
        # message within ack_timeout_s and have not answered since
        self.unreachable: dict[int, float] = {}
        self.names: dict[int, str] = {}  # rank -> its worker id (decode-1@node4), for messages
        # (rank, why) -> replies from it dropped for that reason (unsigned, malformed): the first
        # is logged, the count when this router closes
        self.dropped: dict[tuple[int, str], int] = {}
        # rank -> (its heartbeat value last read, time.monotonic() when that value was first seen)
        self.beats: dict[int, tuple[object, float]] = {}
        # pools.elastic: rows a rank decodes before it is full (pipeline.roles.elastic.full_rows);
        # a hand-off goes to a rank below it while one is (None: by KV alone)
        self.row_cap: int | None = None
        self.read_at = 0.0  # time.monotonic() of the last read of the ranks' records
        self.announced: dict[str, tuple[int, int]] = {}  # request id -> (rank, KV tokens): Announcing
        self.changed = asyncio.Event()
        self._refresh()
        self.monitor = asyncio.create_task(self._watch())
        self.renewing = asyncio.create_task(self._renew())

    def fresh(self, max_age_s: float = 0.25) -> None:
        """Re-read the decode ranks' records now unless read in the last ``max_age_s`` seconds
        (the monitor reads them every second): before a choice that depends on their loads."""
        if time.monotonic() - self.read_at > max_age_s:
            self._refresh()

    def _refresh(self) -> None:
        now = self.read_at = time.monotonic()
        for rank, ep in self.run.decode_endpoints().items():
            beat = ep.get("heartbeat")
            if rank not in self.beats or self.beats[rank][0] != beat:
                self.beats[rank] = (beat, now)
                self.ended.pop(rank, None)  # a new heartbeat: published after those ended
            # No heartbeat written at all (an endpoint without one): alive, as before.
            alive = beat is None or now - self.beats[rank][1] < self.dead_after_s
            self.capacity[rank] = ep.get("kv_capacity_tokens")
            self.names[rank] = ep.get("worker", f"decode-{rank}")
            self.dram_capacity[rank] = ep.get("dram_capacity_tokens")
            self.published[rank] = (ep.get("decoding") or 0, ep.get("kv_tokens_inflight") or 0)
            if ep["endpoint"] != self.endpoints.get(rank):
                self._drop(rank, f"decode rank {rank} restarted")
                s = self.ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(ep["endpoint"])
                self.endpoints[rank], self.sockets[rank] = ep["endpoint"], s
                self.receivers[rank] = asyncio.create_task(self._receive(rank, s))
            if alive and rank not in self.live:
                self.live.add(rank)
                self.changed.set()
            elif not alive and rank in self.live:
                self._drop(rank, f"decode rank {rank} stopped answering (its heartbeat did not change "
                                 f"for {self.dead_after_s:g} s)")

    def _drop(self, rank: int, why: str) -> None:
        self.live.discard(rank)
        self.unreachable.pop(rank, None)  # a new endpoint is a new connection
        self.reserved.pop(rank, None)  # its reservations went with it
        for fut in self.inflight.pop(rank, {}).values():
            if not fut.done():
                fut.set_exception(DecodeLost(why))
        if rank in self.receivers:
            self.receivers.pop(rank).cancel()
            self.sockets.pop(rank).close()
            self.endpoints.pop(rank, None)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._refresh()
            now = time.monotonic()
            for rank, probed in list(self.unreachable.items()):
                if now - probed >= self.ack_timeout_s and rank in self.sockets:
                    self.unreachable[rank] = now
                    try:
                        await self._send(rank, Probe())
                    except zmq.ZMQError as exc:  # the monitor must go on: it is the liveness
                        log.warning("could not probe decode rank %d: %s", rank, exc)

    async def _send(self, rank: int, msg: Message) -> None:
        await self.sockets[rank].send(sign(self.secret, encode(msg)))

    def _reached(self, rank: int) -> None:
        """A message came from ``rank``: the link to it works."""
        if self.unreachable.pop(rank, None) is not None:
            log.warning("decode rank %d (%s) answers again; handing rows to it again", rank, self.names.get(rank))
            self.changed.set()

    async def _acknowledged(self, rank: int, ack: asyncio.Future, request_id: str, what: str) -> None:
        """Wait up to ``ack_timeout_s`` for ``rank`` to acknowledge the message of ``request_id``
        (``ack``: its future, registered before the send); else withdraw it.

        Raises:
            DecodeUnreachable: no acknowledgment in time; ``rank`` is now unreachable.
            DecodeLost: the worker died or restarted meanwhile.
        """
        try:
            await asyncio.wait_for(ack, self.ack_timeout_s)
        except asyncio.TimeoutError:
            if rank in self.live and rank not in self.unreachable:
                self.unreachable[rank] = time.monotonic()
                log.warning("decode rank %d (%s) did not acknowledge a %s within %g s: unreachable from this "
                            "node; probing it every %g s", rank, self.names.get(rank), what,
                            self.ack_timeout_s, self.ack_timeout_s)
            if rank in self.sockets:
                await self._send(rank, Cancel(request_id=request_id))  # queued behind it
            raise DecodeUnreachable(
                f"decode rank {rank} ({self.names.get(rank)}) did not acknowledge the {what} within "
                f"{self.ack_timeout_s:g} s: the link to it is down (its heartbeat goes on); other decode "
                f"ranks take this worker's rows until it answers again") from None

    def _forget(self, rank: int, answer: asyncio.Future, *keys: str | tuple[str, str]) -> None:
        """Stop waiting for the answers under ``keys``. ``answer`` (the result or reservation the
        caller may not have awaited, having failed earlier) is cancelled, or its error marked seen."""
        for k in keys:
            self.inflight.get(rank, {}).pop(k, None)
        if not answer.done():
            answer.cancel()
        elif not answer.cancelled():
            answer.exception()

    def _expect(self, rank: int, key: str | tuple[str, str]) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.inflight.setdefault(rank, {})[key] = fut
        return fut

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(max(0.5, self.timeout_s / 4))
            for rank, ids in list(self.reserved.items()):
                if ids and rank in self.sockets:
                    await self._send(rank, Renew(request_ids=sorted(ids)))

    async def _receive(self, rank: int, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                msg = decode(verify(self.secret, await sock.recv()))
            except Unauthenticated:
                self._dropped(rank, "not signed with this run's secret")
                continue
            except msgspec.DecodeError as exc:
                self._dropped(rank, "malformed", exc)
                continue
            self._reached(rank)
            fut = None
            if isinstance(msg, Received):
                fut = self.inflight.get(rank, {}).get(("received", msg.request_id)) if msg.request_id else None
            elif isinstance(msg, Result):
                fut = self.inflight.get(rank, {}).get(msg.row_key)
            elif isinstance(msg, Reserved):
                fut = self.inflight.get(rank, {}).get(("reserve", msg.request_id))
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def _dropped(self, rank: int, why: str, exc: Exception | None = None) -> None:
        """A reply from ``rank`` is dropped for ``why``: said once per rank and reason (the first
        one's error given), counted after that; :meth:`close` gives the counts."""
        n = self.dropped[(rank, why)] = self.dropped.get((rank, why), 0) + 1
        if n == 1:
            log.warning("dropping a reply from decode rank %d (%s, %s): %s%s; the row it answered, if any, waits "
                        "for it until transport.ack_timeout_s (%g s) or transport.handoff_timeout_s (%g s) runs out; "
                        "further such replies from it are counted, not logged", rank, self.names.get(rank),
                        self.endpoints.get(rank), why, f" ({exc})" if exc is not None else "", self.ack_timeout_s,
                        self.timeout_s)

    def handoffs(self, rank: int) -> int:
        """This worker's hand-offs to ``rank`` sent and not yet answered (rows; :attr:`inflight`
        keys that are row keys, not reservations or acknowledgments)."""
        return sum(isinstance(k, str) for k in self.inflight.get(rank, {}))

    def load(self, rank: int) -> tuple[int, int]:
        """``(rows, KV tokens)`` rank ``rank`` decodes: its last heartbeat's (every 2 s) less this
        worker's hand-offs answered since it was read, or this worker's hand-offs in flight and
        announced (:meth:`announce`)."""
        pub_rows, pub_kv = self.published.get(rank, (0, 0))
        ended_rows, ended_kv = self.ended.get(rank, (0, 0))
        return (max(pub_rows - ended_rows, self.handoffs(rank) + self.announced_rows(rank)),
                max(pub_kv - ended_kv, self.inflight_tokens.get(rank, 0)))

    def reachable(self) -> set[int]:
        """The decode ranks alive (heartbeat) and reachable (acknowledging) from this worker."""
        return self.live - self.unreachable.keys()

    def check_fits(self, kv_tokens: int, prompt_tokens: int | None = None) -> None:
        """:func:`pipeline.roles.errors.check_fits` on the decode workers known to this router."""
        check_fits(self.capacity, self.dram_capacity, kv_tokens, prompt_tokens)

    async def _pick(self, wait_s: float, route: str | None = None, kv_tokens: int = 0,
                    tried: set[int] | None = None) -> int:
        """A live worker for a request of ``kv_tokens`` tokens (see :meth:`handoff`); one not in
        ``tried`` (the ranks this row already failed on) while such a one fits."""
        deadline = time.monotonic() + wait_s
        self.fresh()
        while True:
            # Live, reachable workers big enough for this request (a worker of unknown size
            # counts as one).
            reachable = self.reachable()
            fits = {r for r in reachable if (self.capacity.get(r) or kv_tokens) >= kv_tokens}
            if fits:
                break
            if reachable:  # live workers, none big enough; raises unless a capacity is unknown
                self.check_fits(kv_tokens)
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                cut = sorted(self.live & self.unreachable.keys())
                raise DecodeUnavailable(f"no decode worker alive and reachable for {wait_s:.0f} s" + (
                    f" (alive but unreachable from this node: {', '.join(self.names[r] for r in cut)})"
                    if cut else ""))
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        # A retried row goes to another worker when one fits: the worker it failed on may be the
        # cause (its NIXL handshake timed out, its link is cut) and would fail it again.
        fits = (fits - (tried or set())) or fits
        if route is not None:
            # Prefix-aware: the same prefix always meets the same live worker (rendezvous
            # hashing: when a worker dies, only its prefixes move), whose prefix cache then
            # already holds the shared blocks and takes less KV over NIXL.
            return max(fits, key=lambda r: hashlib.blake2b(f"{r}/{route}".encode(), digest_size=8).digest())
        if self.row_cap:  # pools.elastic: a rank decoding fewer rows than its cap first, packed
            below = {r for r in fits if self.load(r)[0] < self.row_cap}
            room = {r for r in below if not self.capacity.get(r) or self.load(r)[1] + kv_tokens <= self.capacity[r]}
            if room:
                # The one decoding the most rows: a unit's hand-offs fill one rank, the others keep
                # room for a whole unit of their own (ClaimGate). Spread over 3 ranks (test Slurm),
                # a unit's 4 rows left each short of a unit, and the prefill worker idled 100 s.
                return max(room, key=lambda r: (self.load(r)[0], -r))
            fits = below or fits
        if all(self.capacity.get(r) for r in fits):
            # Least loaded by KV: (tokens in flight + this request's) / capacity, tokens in
            # flight as the rank published them or this worker's hand-offs to it (load); ties by rank.
            return min(fits, key=lambda r: ((self.load(r)[1] + kv_tokens) / self.capacity[r], r))
        return min(fits, key=lambda r: (self.load(r)[0], r))

    async def reserve(self, r: Reserve, kv_tokens: int, wait_s: float, route: str | None = None,
                      tried: set[int] | None = None) -> tuple[int, dict]:
        """Reserve ``r.blocks`` slots of a decode worker's DRAM tier for ``r.request_id``, on the
        worker the request would be handed to (see :meth:`handoff`, also for ``tried``). Waits while the tier is
        full: this is where a prefill worker waits for decode capacity with ``offload=dram``.
        Returns (the worker's rank, what the prefill engine needs to write there).

        Raises:
            KVTooLarge: no decode worker could ever hold the request.
            DecodeLost: that worker died or restarted before answering.
            DecodeUnreachable: that worker did not acknowledge the request within ``ack_timeout_s``.
            DecodeUnavailable: no decode worker was alive for ``wait_s`` seconds.
            RuntimeError: the worker could not reserve the slots (its reason).
            TimeoutError: no answer within ``transport.handoff_timeout_s`` seconds.
        """
        rank = await self._pick(wait_s, route, kv_tokens, tried)
        if tried is not None:
            tried.add(rank)
        key = ("reserve", r.request_id)
        fut = self._expect(rank, key)
        ack = self._expect(rank, ("received", r.request_id))
        try:
            await self._send(rank, r)
            await self._acknowledged(rank, ack, r.request_id, "DRAM-tier reservation")
            ans: Reserved = await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"decode rank {rank} reserved no DRAM-tier slots within {self.timeout_s:.0f} s") from None
        finally:
            self._forget(rank, fut, key, ("received", r.request_id))
        if ans.error is not None or ans.pool is None:
            raise RuntimeError(f"decode rank {rank} could not reserve DRAM-tier slots: {ans.error}")
        self.reserved.setdefault(rank, set()).add(r.request_id)
        return rank, ans.pool

    async def release(self, rank: int, request_id: str) -> None:
        """Give back a reservation no hand-off will claim (best effort: the worker also expires it
        once it is no longer renewed)."""
        self.reserved.get(rank, set()).discard(request_id)
        if rank in self.sockets:
            await self._send(rank, Release(request_id=request_id))

    async def handoff(self, h: Handoff, wait_s: float, route: str | None = None, rank: int | None = None,
                      kv_tokens: int | None = None, tried: set[int] | None = None) -> Result:
        """Send ``h`` to a live decode worker whose KV cache can hold it (waiting up to ``wait_s``
        seconds for one); return its result. ``route`` (a prompt-prefix key) picks among them by
        hashing; without it the worker with the most free KV is chosen (:meth:`load`: what it
        last published, every prefill worker's hand-offs and its own units' rows, or this
        worker's hand-offs to it), among those decoding fewer than :attr:`row_cap` rows while one is. ``rank``: send to this
        worker (the one holding the request's DRAM-tier reservation; default: the one it was
        announced to, :meth:`announce`) while it is live.
        ``kv_tokens``: the KV the request needs (default prompt + ``max_new_tokens``;
        :func:`pipeline.roles.handoff.kv_tokens_needed`). ``tried``: the ranks this row was already
        sent to (and failed on); another live worker that fits is preferred, and the rank chosen
        is added.

        Raises:
            KVTooLarge: no live decode worker's KV cache holds ``kv_tokens`` tokens.
            DecodeLost: that worker died or restarted before answering.
            DecodeUnreachable: that worker did not acknowledge the hand-off within ``ack_timeout_s``.
            DecodeUnavailable: no decode worker was alive for ``wait_s`` seconds.
            TimeoutError: no result within ``transport.handoff_timeout_s`` seconds (counted from
            the acknowledgment).
        """
        need = kv_tokens if kv_tokens is not None else len(h.prompt_token_ids) + h.sampling["max_new_tokens"]
        if rank is not None:  # the hand-off claims the reservation: no more renewing
            self.reserved.get(rank, set()).discard(h.request_id)
        announced = self.unannounce(h.request_id)
        rank = rank if rank is not None else announced
        if rank is None or rank not in self.live:
            rank = await self._pick(wait_s, route, need, tried)
        if tried is not None:
            tried.add(rank)
        fut = self._expect(rank, h.row_key)
        ack = self._expect(rank, ("received", h.request_id))
        self.inflight_tokens[rank] = self.inflight_tokens.get(rank, 0) + need
        try:
            await self._send(rank, h)
            await self._acknowledged(rank, ack, h.request_id, "hand-off")
            return await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"decode rank {rank} gave no result within {self.timeout_s:.0f} s") from None
        finally:
            self._forget(rank, fut, h.row_key, ("received", h.request_id))
            self.inflight_tokens[rank] = self.inflight_tokens.get(rank, 0) - need
            self.ended[rank] = tuple(a + b for a, b in zip(self.ended.get(rank, (0, 0)), (1, need)))

    def close(self) -> None:
        for (rank, why), n in sorted(self.dropped.items()):
            if n > 1:
                log.warning("dropped %d replies from decode rank %d (%s) in all: %s", n, rank, self.names.get(rank), why)
        self.monitor.cancel()
        self.renewing.cancel()
        for t in self.receivers.values():
            t.cancel()
        for s in self.sockets.values():
            s.close()
        self.ctx.term()
