"""``pools.elastic`` (issue #40): roles as preferences. A decode rank that is not full and no
longer sent hand-offs (:meth:`ElasticDecode.has_room`) claims work units as a prefill worker
does and serves their rows colocated in its own engine (:class:`ElasticDecode`, a mixin of
:class:`pipeline.roles.decode.DecodeServer`, whose ``run``, ``cfg``, ``worker``, ``engine``,
``capacity``, ``serving`` (hand-offs in flight), ``taking`` and ``claims`` it uses). A prefill
worker (:class:`ElasticPrefill`) serves its rows itself, prefill and decode, while it has a place,
and hands off those that find every place taken (``pools.elastic_prefer=local``, the default);
or hands its rows off and serves one itself only when every decode rank has been full for it for
``pools.elastic_wait_s`` seconds (``handoff``, :func:`decode_full`).

Full (:func:`full_rows`): a decode rank decoding ``pools.elastic_decode_rows`` rows (default
``job.batch_rows``: more than one colocated worker keeps in flight), or whose KV in flight
(prompt + new tokens of each request, :func:`pipeline.roles.handoff.kv_tokens_needed`) would
pass its KV cache's tokens with the row's. Decode ranks publish both counts in their heartbeat
(within 0.2 s of a change); a prefill worker's router reads them (:func:`decode_full`).

Either side claims its next unit when it has places for all of the unit's rows, or has had
places for some of them for ``pools.elastic_claim_wait_s`` seconds (:class:`ClaimGate`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from pipeline.config import Config
from pipeline.engine.model import load_tokenizer
from pipeline.io.output import RowResult
from pipeline.io.prompts import Prompt
from pipeline.roles.colocated import colocated_serve
from pipeline.roles.errors import DecodeUnavailable
from pipeline.roles.handoff import PrefillHandoff, RetryPolicy, kv_tokens_needed
from pipeline.roles.router import DecodeRouter
from pipeline.roles.shard_owner import Progress, ServeRow
from pipeline.roles.work import ClaimGate, own_shards, unit_rows
from pipeline.runtime import failpoints
from pipeline.runtime.claims import Claims

log = logging.getLogger(__name__)


def full_rows(cfg: Config) -> int:
    """Rows a decode rank decodes at once before it counts as full: ``pools.elastic_decode_rows``,
    or ``job.batch_rows`` when that is 0."""
    return cfg.pools.elastic_decode_rows or cfg.job.batch_rows


def mostly_prefill(cfg: Config, p: Prompt) -> bool:
    """Whether row ``p``'s prompt has more than ``pools.elastic_prompt_per_output`` tokens per
    output token it may generate (``max_new_tokens`` x ``n``; 0: never): its decode is too short
    to be worth a KV hand-off, and its prefill worker serves it alone."""
    ratio, s = cfg.pools.elastic_prompt_per_output, p.sampling or cfg.job.sampling
    return bool(ratio) and len(p.token_ids) > ratio * s.max_new_tokens * s.n


def row_kv_tokens(cfg: Config, p: Prompt) -> int:
    """KV tokens row ``p`` may reach (prompt + new tokens of each sample)."""
    return kv_tokens_needed(len(p.token_ids), p.sampling or cfg.job.sampling, cfg.model.max_model_len)


def handoffs_in_flight(router: DecodeRouter) -> int:
    """The router's hand-offs announced (:meth:`DecodeRouter.announce`), or sent and not yet
    answered, over all ranks (rows)."""
    return sum(router.handoffs(r) for r in router.inflight) + len(router.announced)


def decode_full(router: DecodeRouter, kv_tokens: int, rows: int, pending: int = 0) -> bool:
    """Whether every live, reachable decode rank of ``router`` is full for a request of
    ``kv_tokens`` KV tokens: it decodes ``rows`` rows or more, or its KV in flight plus
    ``kv_tokens`` passes its KV cache's tokens. A rank's load is :meth:`DecodeRouter.load`
    (its last heartbeat, every 2 s: all prefill workers' hand-offs and its own units' rows, less
    this worker's hand-offs answered since; or this worker's hand-offs to it in flight now),
    plus ``pending`` (this worker's rows bound for a hand-off but still in prefill: their rank
    is not chosen yet, so each rank counts them).
    True with no live, reachable rank: every rank is lost, and the prefill worker serves its
    rows itself until one is back (a rank first seen counts as live for
    ``transport.decode_dead_after_s`` seconds, so this is not the start of a run). The ranks'
    records are read again first when older than 0.25 s (:meth:`DecodeRouter.fresh`)."""
    return max(free_rows(router, kv_tokens, rows), default=0) <= pending


def free_rows(router: DecodeRouter, kv_tokens: int, rows: int) -> list[int]:
    """Per live, reachable decode rank whose KV cache has room for ``kv_tokens`` more tokens
    (its KV in flight, :meth:`DecodeRouter.load`, plus these within its KV cache's tokens), the
    rows it could take before it decodes ``rows`` (0 or more); the ranks' records read again
    first when older than 0.25 s (:meth:`DecodeRouter.fresh`)."""
    router.fresh()
    out = []
    for r in router.reachable():
        load_rows, kv = router.load(r)
        cap = router.capacity.get(r)
        if not (cap and kv + kv_tokens > cap):
            out.append(max(0, rows - load_rows))
    return out


class ElasticDecode:
    """Claiming and serving work units while the decode rank is not full (see the module doc)."""

    own_rows = own_kv = 0  # rows of its own units in flight, and the KV tokens they may reach
    full_at = 0.0  # time.monotonic() when this rank was last seen full
    gate: ClaimGate | None = None  # when to claim the next unit (set by start_taking_units)
    handoff_at = 0.0  # time.monotonic() when a hand-off last reached this rank

    def start_taking_units(self) -> None:
        """``pools.elastic``: claim work units while not full (:meth:`take_units`), as worker
        ``decode-RANK`` in the claims, with its own heartbeat there: a requeued rank resumes its
        own units; a lost one's are taken over by a worker still claiming, as a prefill
        worker's are; the launcher waits for it as for any worker serving the run."""
        self.claims = Claims(self.run.path, self.worker.split("@")[0], self.cfg.pools.claim_dead_after_s)
        self.claims.start_heartbeat()
        self.full_at = time.monotonic()  # a first claim after elastic_idle_s
        self.gate = ClaimGate(self.cfg.pools.elastic_claim_wait_s)
        self.taking = asyncio.create_task(self.take_units())

    def load(self) -> dict[str, int]:
        """What the heartbeat publishes: ``serving`` (hand-offs and reservations in flight),
        ``decoding`` (those plus the rows of its own units, rows) and ``kv_tokens_inflight`` (the
        KV tokens all of them may reach)."""
        serving = getattr(self, "serving", {})  # none yet at the first publish
        handoff_kv = getattr(self, "handoff_kv", {})
        expected = list(getattr(self, "expected", {}).values())
        return {"serving": len(serving), "decoding": len(serving) + len(expected) + self.own_rows,
                "kv_tokens_inflight": sum(handoff_kv.values()) + sum(kv for kv, _ in expected) + self.own_kv}

    def expect(self, request_id: str, kv_tokens: int) -> None:
        """A prefill worker announced a hand-off of ``kv_tokens`` KV tokens
        (:class:`~pipeline.wire.messages.Expect`): counted as decoding until it arrives."""
        self.expected[request_id] = (kv_tokens, time.monotonic())
        self.handoff_at = time.monotonic()
        self.is_full()
        self.load_changed()

    def unexpect(self, request_id: str) -> None:
        """The announced hand-off ``request_id`` arrived or was withdrawn."""
        if self.expected.pop(request_id, None) is not None:
            self.load_changed()

    def expire_expected(self, after_s: float) -> None:
        """Stop counting announced hand-offs that have not come in ``after_s`` seconds (their
        prefill worker died, or its withdrawal was lost)."""
        now = time.monotonic()
        for request_id, (_, at) in list(self.expected.items()):
            if now - at > after_s:
                self.unexpect(request_id)

    def load_changed(self) -> None:
        """Publish the load soon (:meth:`Heartbeat.poke`), not at the next 2 s beat: a prefill
        worker reading a load up to 2 s old sent its rows to ranks that had just claimed a unit
        each and read as empty (test Slurm, decode-heavy 1P:3D: every rank then decoded 5-6 rows
        while the prefill worker's own engine ended 18-22 s before them)."""
        self.beating.poke()

    def count_handoff(self, request_id: str, kv_tokens: int, task: asyncio.Task) -> None:
        """Hand-off ``request_id`` may reach ``kv_tokens`` KV tokens until ``task`` ends."""
        self.expected.pop(request_id, None)
        self.handoff_kv[request_id] = kv_tokens
        self.handoff_at = time.monotonic()

        def ended(_: asyncio.Task) -> None:
            self.row_ending(counted=request_id in self.serving)  # DecodeServer pops it first
            self.handoff_kv.pop(request_id, None)
            self.load_changed()

        task.add_done_callback(ended)
        self.is_full()
        self.load_changed()

    def row_ending(self, counted: bool) -> None:
        """A row of this rank ends (``counted``: still in :meth:`load`): if the rank was full with
        it, ``pools.elastic_idle_s`` counts from now, not from the last time :meth:`has_room`
        was asked (up to 0.5 s before: a rank claimed a unit 0.6 s after its rows ended, beside
        a prefill worker's hand-offs to it)."""
        if self.load()["decoding"] + (not counted) >= full_rows(self.cfg):
            self.full_at = time.monotonic()

    def is_full(self) -> bool:
        """Whether this rank decodes :func:`full_rows` rows or more, or its KV in flight reaches
        its KV cache's tokens (noted: :meth:`has_room` waits ``pools.elastic_idle_s`` after it)."""
        load = self.load()
        full = load["decoding"] >= full_rows(self.cfg) or bool(
            self.capacity and load["kv_tokens_inflight"] >= self.capacity)
        if full:
            self.full_at = time.monotonic()
        return full

    def has_room(self) -> bool:
        """Not full now, nor for the last ``pools.elastic_idle_s`` seconds, and no hand-off
        reached it in that time: while the prefill pool keeps sending, the room is theirs. With
        a :attr:`gate` (claiming units), also places (:func:`full_rows` less the rows decoding)
        for all of a unit's rows, or for some of them for ``pools.elastic_claim_wait_s``."""
        last = max(self.full_at, self.handoff_at)
        if self.is_full() or time.monotonic() - last < self.cfg.pools.elastic_idle_s:
            return False
        if self.gate is None:
            return True
        rows = full_rows(self.cfg)
        return self.gate.ready(rows - self.load()["decoding"], min(rows, unit_rows(self.run)))

    async def take_units(self) -> None:
        """While this rank :meth:`has_room`, claim work units (the prefill workers' claims:
        :func:`pipeline.roles.work.own_shards`) and serve their rows in this engine, prefill and
        decode (:func:`pipeline.roles.colocated.colocated_serve`: their ``prefill_worker`` names
        this rank, their ``decode_worker`` is null as in any colocated row); while it is full,
        wait (the units taken are served on, hand-offs joining the engine's batches), and claim
        the next unit once it has room again. Ends when the run is settled or asked to stop.

        Raises:
            Exception: a worker failure while serving a unit (its engine died).
        """
        tokenizer = await asyncio.to_thread(load_tokenizer, self.cfg)
        serve_row = colocated_serve(self.cfg, self.engine, self.worker, self.run.sample_lists())

        kill_after, served = failpoints.decode_kill_after_rows(), 0  # fault injection (tests only)

        async def serve(p: Prompt) -> RowResult:
            nonlocal served
            need = row_kv_tokens(self.cfg, p)
            self.own_rows, self.own_kv = self.own_rows + 1, self.own_kv + need
            self.load_changed()
            try:
                return await serve_row(p)
            finally:
                self.row_ending(counted=True)
                self.own_rows, self.own_kv = self.own_rows - 1, self.own_kv - need
                self.load_changed()
                served += 1
                if served == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)

        progress = Progress(self.run, self.worker)
        poll_s = min(1.0, max(0.1, self.cfg.pools.elastic_idle_s / 2))

        async def room() -> bool:
            """Wait until this rank has room (True), or the run is settled or stopping (False)."""
            polls = 0
            while not self.has_room():
                # the run's state read every 2 s at most (all_settled lists done/ and failed/)
                if polls % max(1, round(2.0 / poll_s)) == 0 and (
                        self.run.stop_requested() or await asyncio.to_thread(self.run.all_settled)):
                    return False
                polls += 1
                await asyncio.sleep(poll_s)
            return not (self.run.stop_requested() or await asyncio.to_thread(self.run.all_settled))

        while await room():
            # Claims the next unit whenever it has room, until none is left to claim.
            await own_shards(self.run, self.cfg, self.claims, self.worker, tokenizer, serve,
                             progress=progress, keep_claiming=room)
            await asyncio.sleep(poll_s)


class ElasticPrefill:
    """A prefill worker's rows under ``pools.elastic``. With ``pools.elastic_prefer=local`` each
    is served by this worker's engine alone while it has a place (``job.batch_rows`` rows at
    once), else, once no unit is left to claim (``units_left`` false), handed off to a decode
    rank below its row cap whose KV cache has room (:meth:`overflows`), else it waits for a
    place; the worker claims its next unit when its own
    places could start the unit's rows. With ``handoff``, each is handed off (``handoff``) unless
    it is mostly prefill (:func:`mostly_prefill`), or every live decode rank has been full for
    it (:func:`decode_full`) for ``pools.elastic_wait_s`` seconds, or no decode rank is left
    alive; then this worker's engine serves it alone (``local``:
    :func:`pipeline.roles.colocated.colocated_serve`; the row's ``decode_worker`` is null). At
    most ``job.batch_rows`` rows of each kind at once; a row for this engine finding its places
    taken is handed off all the same while a rank's KV cache has room (:meth:`overflows`); a
    row finding its kind's limit reached otherwise, or the decode pool full for less than
    ``elastic_wait_s``, waits (re-deciding every 0.5 s or
    when a row of this worker ends); the worker claims its next unit only when its rows could
    start at once (:meth:`room`, :meth:`places`). A row whose hand-off failed with no decode
    rank left alive is served here."""

    def __init__(self, cfg: Config, handoff: PrefillHandoff, local: ServeRow, units_left: Callable[[], bool] = bool):
        self.cfg, self.handoff, self.local, self.units_left = cfg, handoff, local, units_left
        handoff.no_retry_without_decode = True  # a row whose decode rank was lost, none left: served here
        handoff.announce = True  # each hand-off's rank named before its prefill (pipeline.roles.announce)
        self.limit, self.rows_full = cfg.job.batch_rows, full_rows(cfg)
        self.local_first = cfg.pools.elastic_prefer == "local"
        handoff.router.row_cap = self.rows_full  # a hand-off to a rank not full while one is
        self.handing_off = self.serving_here = self.waiting = 0
        self.gate = ClaimGate(cfg.pools.elastic_claim_wait_s)
        self.last_need, self.last_here = 0, False  # the last row's KV tokens; mostly prefill
        self.freed = asyncio.Event()

    async def room(self) -> bool:
        """Wait until the rows of a next unit could start at once (:meth:`places`; all of a
        unit's rows, :func:`unit_rows`, or some of them for ``pools.elastic_claim_wait_s``:
        :class:`ClaimGate`; then True): the worker's ``keep_claiming``, so that it claims its
        next unit only when it can start its rows, leaving the units it could not start to a
        worker or decode rank with room. (The worker's row places, 2 x ``job.batch_rows``, freed
        by the last unit's rows starting are not enough: a unit claimed with every place of both
        kinds taken waited 18 s on a busy worker while another idled, measured on the test
        Slurm.)"""
        want = min(self.limit * (1 if self.local_first else 2), unit_rows(self.handoff.router.run))
        await asyncio.sleep(0.05)  # the rows just started reach their choice first
        while not self.gate.ready(self.places(), want):
            await asyncio.sleep(0.1)
        return True

    def places(self) -> int:
        """New rows (each of the last row's KV need) that would start now, by the rule they
        will meet: handed off while a decode rank has room (up to this worker's free hand-off
        places and the decode ranks' free rows, :func:`full_rows` each), then, the ranks full,
        served here (this engine's free places); a row mostly prefill (the last one was), here
        only. None while a row of this worker waits: its unit first. None either while a rank
        has room and this engine serves rows of its own: the rank claims a unit itself (below).
        With ``pools.elastic_prefer=local``, this engine's free places alone (a rank with room
        claims a unit itself)."""
        if self.waiting:
            return 0
        here = self.limit - self.serving_here
        if self.last_here or self.local_first:
            return here
        free = free_rows(self.handoff.router, self.last_need, self.rows_full)
        decode_room = max(0, sum(free) - self._pending())
        if decode_room and self.serving_here:
            # A rank's room waits for a hand-off's KV as long as the prefill takes, and on an
            # engine decoding rows of its own that is longer than on the rank's own engine: the
            # rank serves a unit of its own better. Measured on the test Slurm (capped,
            # decode-heavy 2P:2D and 1P:3D): ranks idled 21-41 s for 4 rows' KV from prefill
            # workers that decoded 4 rows of their own, where the rank's own prefill takes ~20 s.
            return 0
        handoff = self.limit - self.handing_off
        # Rows beyond this worker's hand-off places, the ranks not yet full, wait (serve).
        return handoff if decode_room > handoff else decode_room + here

    def _pending(self) -> int:
        """This worker's rows bound for a hand-off still in prefill (:func:`decode_full`)."""
        return max(0, self.handing_off - handoffs_in_flight(self.handoff.router))

    def here(self, p: Prompt, need: int, full_since: float | None) -> tuple[bool, float | None]:
        """Whether row ``p`` (``need`` KV tokens) is for this worker's engine now, and since when
        the decode pool has been full for it (None: not full)."""
        if mostly_prefill(self.cfg, p):
            return True, None
        router = self.handoff.router
        if not decode_full(router, need, self.rows_full, self._pending()):
            return False, None
        full_since = full_since or time.monotonic()
        lost = not router.reachable()
        return lost or time.monotonic() - full_since >= self.cfg.pools.elastic_wait_s, full_since

    def overflows(self, p: Prompt, need: int) -> bool:
        """Whether row ``p`` (``need`` KV tokens), for this worker's engine (every decode rank
        full by rows: :func:`full_rows`) but finding every place there taken, is handed off all
        the same, to a decode rank whose KV cache has room for it (not full by KV), rather than
        wait here: the row cap is a preference, the KV cache the limit. Not a row mostly prefill.
        A row that waited on a busy worker while a rank could decode it made the run's tail:
        measured on the test Slurm (nodes capped at 0.5 cores, decode-heavy, 2P:2D), 4 rows
        waited 28 s for a place and then took a wave of their own, 112 s against 87 s colocated.
        With ``pools.elastic_prefer=local``, only to a rank below the row cap (:func:`full_rows`):
        there ranks serve units of their own, at the cap while they do, and rows handed to them
        beyond it made the run's tail (test Slurm, capped, skewed output lengths, 3P:1D: the one
        decode rank took 8 overflowing rows beside its own 8 and ended 9-35 s after the prefill
        workers), while this worker's own places free within its claim; and only once no unit
        is left to claim (``units_left``), else a rank claims one itself: rows handed off before
        made the tail (mixed lengths, 2P:2D, 3P:1D: ranks took 16-19 rows, prefill workers 8-12)."""
        rows = self.rows_full if self.local_first else sys.maxsize
        return (not mostly_prefill(self.cfg, p) and self.serving_here >= self.limit
                and not (self.local_first and self.units_left())
                and not decode_full(self.handoff.router, need, rows, self._pending()))

    async def serve(self, p: Prompt) -> RowResult:
        """The row's generation (or error row); raises what
        :meth:`PrefillHandoff.serve` raises."""
        need, full_since = row_kv_tokens(self.cfg, p), None
        self.last_need, self.last_here = need, mostly_prefill(self.cfg, p)
        while True:
            # elastic_prefer=local: every row is for this engine, handed off only if it overflows.
            here, full_since = (True, None) if self.local_first else self.here(p, need, full_since)
            if here and self.serving_here < self.limit:
                self.serving_here += 1
                try:
                    return await self.local(p)
                finally:
                    self.serving_here -= 1
                    self.freed.set()
            if self.handing_off < self.limit and (full_since is None and not here or here and self.overflows(p, need)):
                self.handing_off += 1
                try:
                    return await self.handoff.serve(p)
                except (*RetryPolicy.RETRIED, DecodeUnavailable):
                    if self.handoff.router.reachable():
                        raise
                    log.warning("row %s: no decode rank is left alive; serving it on this worker alone", p.row_key)
                    continue  # decode_full is now true: served here
                finally:
                    self.handing_off -= 1
                    self.freed.set()
            self.freed.clear()
            self.waiting += 1
            try:
                await asyncio.wait_for(self.freed.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
            finally:
                self.waiting -= 1
