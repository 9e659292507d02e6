"""``pools.elastic`` on a decode rank (issue #40, part 1): while no hand-off comes, it claims work
units as a prefill worker does and serves their rows colocated in its own engine. A mixin of
:class:`pipeline.roles.decode.DecodeServer`, whose ``run``, ``cfg``, ``worker``, ``engine``,
``serving`` (hand-offs in flight), ``last_handoff``, ``taking`` and ``claims`` it uses."""

from __future__ import annotations

import asyncio
import time

from pipeline.engine.model import load_tokenizer
from pipeline.roles.colocated import colocated_serve
from pipeline.roles.shard_owner import Progress
from pipeline.roles.work import own_shards
from pipeline.runtime.claims import Claims


class ElasticDecode:
    """Claiming and serving work units while the decode rank is idle (see the module doc)."""

    def start_taking_units(self) -> None:
        """``pools.elastic``: claim work units while idle (:meth:`take_units`), as worker
        ``decode-RANK`` in the claims, with its own heartbeat there: a requeued rank resumes its
        own units; a lost one's are taken over by a worker still claiming, as a prefill
        worker's are; the launcher waits for it as for any worker serving the run."""
        self.claims = Claims(self.run.path, self.worker.split("@")[0])
        self.claims.start_heartbeat()
        self.taking = asyncio.create_task(self.take_units())

    def idle(self) -> bool:
        """No hand-off in flight, and none received for ``pools.elastic_idle_s`` seconds."""
        return not self.serving and time.monotonic() - self.last_handoff >= self.cfg.pools.elastic_idle_s

    async def take_units(self) -> None:
        """While this rank is :meth:`idle`, claim work units (the prefill workers' claims:
        :func:`pipeline.roles.work.own_shards`) and serve their rows in this engine, prefill and
        decode (:func:`pipeline.roles.colocated.colocated_serve`: their ``prefill_worker`` names
        this rank, their ``decode_worker`` is null as in any colocated row); stop claiming when
        a hand-off comes (the units taken are served to the end, the hand-offs joining the
        engine's batches meanwhile), and claim again once idle. Ends when the run is settled or
        asked to stop.

        Raises:
            Exception: a worker failure while serving a unit (its engine died).
        """
        tokenizer = await asyncio.to_thread(load_tokenizer, self.cfg)
        serve = colocated_serve(self.cfg, self.engine, self.worker, self.run.sample_lists())
        progress = Progress(self.run, self.worker)
        poll_s = min(1.0, max(0.1, self.cfg.pools.elastic_idle_s / 2))
        while not (self.run.stop_requested() or await asyncio.to_thread(self.run.all_settled)):
            if self.idle():
                await own_shards(self.run, self.cfg, self.claims, self.worker, tokenizer, serve,
                                 progress=progress, keep_claiming=self.idle)
            await asyncio.sleep(poll_s)
