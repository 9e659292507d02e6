"""A prefill or colocated worker's loop over the run's work units: claim one
(:mod:`pipeline.runtime.claims`), serve it (:class:`~pipeline.roles.shard_owner.ShardOwner`),
claim the next once every row of the current one has started, until none is left; and assemble
split shards whose parts are all written (:mod:`pipeline.io.units`)."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import Any, Awaitable, Callable, Iterable

from pipeline.config import Config
from pipeline.io.shards import Shard
from pipeline.io.units import Unit, part_written, parts_done
from pipeline.roles.shard_owner import Progress, ServeRow, ShardOwner, finish_split
from pipeline.runtime.claims import Claims
from pipeline.runtime.rundir import RunDir


def unit_rows(run: RunDir) -> int:
    """Rows of one of ``run``'s work units on average (its rows counted at launch over its
    units, rounded up); 1 when the rows were not counted."""
    units = len(run.units())
    return max(1, -(-run.total_rows() // units)) if units else 1


class ClaimGate:
    """When a worker claims its next unit of ``want`` rows with ``places`` rows it could start
    now (:meth:`ready`): at once with places for all of them; with places for some, once it
    has had places for some for ``wait_s`` seconds (``pools.elastic_claim_wait_s``), so that a
    worker or decode rank with places for all of them takes it first. The unit's rows that
    cannot start wait on the worker that claimed it: measured on the test Slurm (capped at
    0.5 cores, decode-heavy 2P:2D), the last two units went to a worker with one place each
    while the other's 4 places freed 1.5 s later, and it then idled 36 s."""

    def __init__(self, wait_s: float):
        self.wait_s, self.since = wait_s, None  # since: time.monotonic() places first fell short

    def ready(self, places: int, want: int) -> bool:
        """Whether to claim now (then the wait starts again for the next unit)."""
        if places <= 0:
            self.since = None
            return False
        now = time.monotonic()
        if places < want:
            self.since = self.since or now
            if now - self.since < self.wait_s:
                return False
        self.since = None
        return True


async def own_shards(run: RunDir, cfg: Config, claims: Claims, worker: str, tokenizer: Any,
                     serve: ServeRow, limit: int | None = None, progress: Progress | None = None,
                     keep_claiming: Callable[[], bool | Awaitable[bool]] = lambda: True,
                     batch_rows: int | None = None) -> None:
    """Claim units one after another (this worker's own first, then the next nobody holds, in
    input order) and serve each, skipping those already done or failed; at most ``limit`` units
    in all (None: until none is left). ``keep_claiming``: asked (and awaited, when it returns an
    awaitable: it may wait for room) before each claim; false ends the claiming (the units taken
    are served to the end). ``progress``: the worker's, when it
    calls this more than once (default: a new one).

    At most ``batch_rows`` rows (default ``job.batch_rows``) are being served at once across the worker, whatever the
    number and size of the units: the next unit is claimed as soon as every row of the
    previous one has started, so a worker that drew small units takes the next while another is
    still on a big one. A row that cannot become a prompt, or whose serving raises, becomes
    an error row: every input row gives exactly one output row, in input order. A shard that
    cannot be read or written is recorded as failed (``RUN_DIR/failed/``) and the others go on.
    """
    progress = progress or Progress(run, worker)
    shards = {s.index: s for s in run.shards()}
    units = run.units()
    slots = asyncio.Semaphore(batch_rows or cfg.job.batch_rows)
    finishing, started = [], set()
    try:
        await asyncio.to_thread(assemble_ready, run, claims, tokenizer, progress, worker)
        while await _asked(keep_claiming) and (i := next_unit(run, claims, units, shards, limit, started)) is not None:
            started.add(i)
            owner = ShardOwner(run, cfg, shards[units[i].shard], worker, tokenizer, serve, slots, progress,
                               still_mine=lambda i=i: claims.holds(i), unit=units[i],
                               assembly=lambda s=units[i].shard: claims.claim(len(units) + s))
            finishing.append(asyncio.create_task(owner.own()))
            await owner.dispatched.wait()
        await asyncio.gather(*finishing)
    finally:
        for t in finishing:
            t.cancel()
    progress.add(force=True)


async def _asked(keep_claiming: Callable[[], bool | Awaitable[bool]]) -> bool:
    go = keep_claiming()
    return bool(await go) if inspect.isawaitable(go) else bool(go)


TAKEOVER = "takeover"  # RUN_DIR/takeover: the launcher started an array task to take over a lost worker's units


async def claim_first_or_take_over(run: RunDir, claims: Claims, limit: int | None) -> int | None:
    """:func:`claim_first`; when nothing is left to claim but the launcher started this task to
    take over the units of workers it saw lost (``RUN_DIR/takeover``: their heartbeats as it
    read them, ``pools.elastic``), claim again with those workers presumed dead
    (:meth:`Claims.presume_dead`), then every 5 s until their claims are stale to this process
    (a claimant first seen counts as alive for ``dead_after_s`` seconds, 15 s more allowed) or
    the run is settled. None: nothing to serve."""
    first = claim_first(run, claims, limit)
    try:
        lost = json.loads((run.path / TAKEOVER).read_text())
    except (OSError, ValueError):
        return first
    if first is None:
        claims.presume_dead(lost)
        first = claim_first(run, claims, limit)
    deadline = time.monotonic() + claims.dead_after_s + 15
    while first is None and time.monotonic() < deadline and not run.all_settled():
        await asyncio.sleep(5)
        first = claim_first(run, claims, limit)
    return first


def claim_first(run: RunDir, claims: Claims, limit: int | None) -> int | None:
    """Claim a worker's first unit before its engine starts (None: nothing left for it, so it
    starts no engine); :func:`own_shards` then finds it among the worker's own claims."""
    units = run.units()
    return next_unit(run, claims, units, {s.index: s for s in run.shards()}, limit)


def next_unit(run: RunDir, claims: Claims, units: list[Unit], shards: dict[int, Shard], limit: int | None = None,
              started: Iterable[int] = ()) -> int | None:
    """Claim the next unit for this worker (:meth:`Claims.claim_next`, in input order), skipping
    those it has ``started`` and those settled (:func:`unit_settled`, asked only of a unit about
    to be taken, so a claim costs the same however many units are done); None when none is left."""
    return claims.claim_next(range(len(units)), (), limit, started, is_settled=_settled_check(run, shards, units))


def units_left(run: RunDir, claims: Claims) -> Callable[[], bool]:
    """A check of whether any of the run's units is left to claim: neither claimed (by a worker
    alive or not) nor settled (:func:`unit_settled`; a resumed run's units done in an earlier
    launch are never claimed again). :meth:`Claims.all_claimed`: each unit looked at about once
    over all the calls."""
    units, shards = run.units(), {s.index: s for s in run.shards()}
    settled = _settled_check(run, shards, units)
    return lambda: not claims.all_claimed(len(units), settled)


def _settled_check(run: RunDir, shards: dict[int, Shard], units: list[Unit]) -> Callable[[int], bool]:
    """:func:`unit_settled` by unit index, as :class:`Claims` asks it."""
    return lambda i: unit_settled(run, shards, units[i])


def unit_settled(run: RunDir, shards: dict[int, Shard], unit: Unit) -> bool:
    """Whether ``unit`` needs no more serving: its shard is done or failed, or (a part of a
    split shard) its part is written; from that shard's own marks only."""
    shard = shards[unit.shard]
    return (run.done_path(shard).is_file() or run.failed_path(shard).is_file()
            or (unit.split and part_written(run.parts_dir(shard), unit)))


def assemble_ready(run: RunDir, claims: Claims, tokenizer: Any, progress: Progress | None = None,
                   worker: str | None = None) -> None:
    """Assemble every split shard whose parts are all written but which is not done (its
    assembler was lost mid-way), claiming each assembly first; ``worker`` (default: the claims'
    name) is recorded as its assembler."""
    shards = {s.index: s for s in run.shards()}
    units = run.units()
    done = set(run.done()) | set(run.failed())
    for u in units:
        shard = shards[u.shard]
        if u.split and u.part == 0 and shard.name not in done and parts_done(run.parts_dir(shard), u.parts):
            if claims.claim(len(units) + u.shard):
                finish_split(run, shard, u.parts, tokenizer, worker or claims.worker, progress)
