"""``pools.elastic``: a prefill worker names the decode rank of a hand-off before its prefill
(:class:`~pipeline.wire.messages.Expect`), so that the rank counts the row in its load while the
prefill runs. Without it, a rank that had just freed its rows claimed a unit of its own during
the prefill, and two prefill workers each counted on the same room: on the capped test Slurm
(decode-heavy 2P:2D) 8 rows prefilled for one freed rank went to the other, already decoding a
unit, which then decoded 12 rows while both prefill workers' engines ended 18-27 s before it."""

from __future__ import annotations

import logging

import zmq

from pipeline.wire.messages import Cancel, Expect

log = logging.getLogger(__name__)


class Announcing:
    """A mixin of :class:`pipeline.roles.router.DecodeRouter` (its ``_pick``, ``_send``,
    ``inflight_tokens``, ``sockets``): hand-offs announced and not yet sent."""

    def announced_rows(self, rank: int) -> int:
        """Rows announced to ``rank`` whose hand-off is not sent yet."""
        return sum(r == rank for r, _ in self.announced.values())

    async def announce(self, request_id: str, kv_tokens: int, route: str | None, wait_s: float,
                       tried: set[int] | None = None) -> int:
        """Pick the rank for request ``request_id`` (``kv_tokens`` KV tokens; as
        :meth:`DecodeRouter.handoff` would, by ``route`` or load) and tell it a hand-off is
        coming; count it in that rank's load here until :meth:`handoff` sends it or
        :meth:`withdraw` drops it. Returns the rank. A message that cannot be sent is logged: the
        hand-off then goes as it would have.

        Raises:
            DecodeUnavailable: no decode worker was alive for ``wait_s`` seconds.
        """
        rank = await self._pick(wait_s, route, kv_tokens, tried)
        self.announced[request_id] = (rank, kv_tokens)
        self.inflight_tokens[rank] = self.inflight_tokens.get(rank, 0) + kv_tokens
        try:
            await self._send(rank, Expect(request_id=request_id, kv_tokens=kv_tokens))
        except (zmq.ZMQError, KeyError) as exc:
            log.warning("could not announce %s to decode rank %d: %s", request_id, rank, exc)
        return rank

    def unannounce(self, request_id: str) -> int | None:
        """Stop counting request ``request_id`` as announced; the rank it was announced to (None:
        it was not)."""
        rank, kv_tokens = self.announced.pop(request_id, (None, 0))
        if rank is not None:
            self.inflight_tokens[rank] = self.inflight_tokens.get(rank, 0) - kv_tokens
        return rank

    async def withdraw(self, request_id: str) -> None:
        """The announced hand-off will not come (its prefill failed): the rank stops counting it."""
        rank = self.unannounce(request_id)
        if rank is not None and rank in self.sockets:
            try:
                await self._send(rank, Cancel(request_id=request_id))
            except zmq.ZMQError as exc:
                log.warning("could not withdraw %s from decode rank %d: %s", request_id, rank, exc)
