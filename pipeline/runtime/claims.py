"""Work claimed at run time: a prefill or colocated worker takes the next work unit (a shard, or
a row range of a big one: :mod:`pipeline.io.units`) nobody holds when it has room, instead of a
fixed group chosen at submission, so a worker that drew small units goes on to the next one
while another is still on a big one (issue #29). Claims are by unit index (the position in
``RunDir.units()``); the assembly of split shard ``s`` from its parts is claimed as index
``len(units) + s``, so that one worker assembles it.

Protocol, on the run directory's shared file system (POSIX or NFS; no lock server)::

    RUN_DIR/claims/unit-00007.0         claim of unit 7, generation 0: {"worker", "host", "pid", "at"}
    RUN_DIR/claims/unit-00007.1         generation 1: taken over from a dead holder
    RUN_DIR/claims/workers/WORKER.json  the worker's heartbeat, rewritten every HEARTBEAT_S

- **Claiming** writes the claim to a hidden temporary file and hard-links it to the next
  generation's name. ``link`` fails with ``EEXIST`` when the name exists, on NFS too (the classic
  NFS-safe lock), so exactly one claimant wins a generation, and a reader never sees a claim half
  written. The holder of a unit is the worker named by its highest generation.
- **A requeued worker** (the same task, on any node: a Slurm requeue, a preempted task) finds
  its own claims and resumes them first, from the unit's row checkpoints.
- **A dead holder** is one whose heartbeat has not changed for ``dead_after_s`` seconds of the
  observer's own clock (no comparison between the clocks of two nodes). Its unit is taken over
  by linking the next generation; two claimants racing for it cannot both win.
- **A holder whose unit was taken over** (it was only slow, or cut off) sees that the highest
  generation no longer names it (:meth:`Claims.holds`) and does not mark it done.
- **A worker that ends** (done, or failed with an exception) writes a last heartbeat marked
  ``ended``; one killed outright (SIGKILL, a lost node) never does. The launcher waits for every
  worker whose heartbeat lives and has not ended (:class:`LiveWorkers`: workers that joined the run
  from another launch included) before it stops the decode workers.
- A new launch of the same run directory starts with no claims (:meth:`RunDir.create` clears them):
  no worker of an earlier launch is still running then.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from pipeline.io.atomic import temporary_name, write_json
from pipeline.runtime.heartbeat import Heartbeat

HEARTBEAT_S = 5.0  # seconds between a claimant's heartbeats
DEAD_AFTER_S = 60.0  # a heartbeat unchanged this long (observer's clock) marks its worker dead (pools.claim_dead_after_s)
_CLAIM = re.compile(r"^unit-(\d+)\.(\d+)$")


class Claims:
    """One worker's view of the run's claims.

    Args:
        run_path: the run directory.
        worker: this worker's task (``prefill-3``, without its host); a task requeued onto any
            node has the same.
        dead_after_s: seconds a holder's heartbeat may stay unchanged before its claims are
            taken over.
    """

    def __init__(self, run_path: str | os.PathLike, worker: str, dead_after_s: float = DEAD_AFTER_S):
        self.dir = Path(run_path) / "claims"
        self.worker, self.dead_after_s = worker, dead_after_s
        self._seen: dict[str, tuple[Any, float]] = {}  # worker -> (heartbeat last read, when it changed)
        self._beat = 0
        # What this worker has seen of the claims: a claim file is written once and never changed
        # (linked from a complete temporary file), and within a launch none is removed, so what
        # was read once stays true. unit -> (highest generation seen, worker named there or None
        # when not read yet); the names read, by file name; whether the folder was listed once.
        self._known: dict[int, tuple[int, str | None]] = {}
        self._names: dict[str, str] = {}
        self._listed = False
        self._settled: set[int] = set()  # units is_settled said were settled (they stay so)
        self._unclaimed_from = 0  # every unit below it has been seen claimed (all_claimed)
        self._heartbeat: Heartbeat | None = None
        (self.dir / "workers").mkdir(parents=True, exist_ok=True)

    # -- reading --------------------------------------------------------------------------------
    def holders(self) -> dict[int, tuple[int, str]]:
        """Every claimed index -> (highest generation, worker named there): the folder listed,
        each claim file read once by this worker (they never change)."""
        held = holders(self.dir.parent, self._names)
        self._known.update(held)
        self._listed = True
        return held

    def holder(self, index: int) -> tuple[int, str] | None:
        """(highest generation, worker named there) of unit ``index``, None when unclaimed: from
        the unit's own claim files, without listing the folder (generations are made one after
        another, so the highest is the first one missing, less one)."""
        g, _ = self._known.get(index, (-1, None))
        while os.path.lexists(self.dir / _name(index, g + 1)):
            g += 1
        if g < 0:
            return None
        worker = _read_worker(self.dir, _name(index, g), self._names)
        self._known[index] = (g, worker)
        return g, worker

    def all_claimed(self, count: int, is_settled: Callable[[int], bool] | None = None) -> bool:
        """Whether each of units ``0 .. count - 1`` is claimed by some worker (alive or not) or
        settled (``is_settled(index)``: done or failed in an earlier launch of a resumed run,
        where nobody claims it again): nothing is left for a worker to claim but a lost worker's
        units. Claims and settled marks are never removed within a launch, so the units seen
        claimed or settled are not looked at again: a run's calls cost about one look at each
        unit in all."""
        i = self._unclaimed_from
        while i < count and (i in self._known or i in self._settled or os.path.lexists(self.dir / _name(i, 0))
                             or (is_settled is not None and is_settled(i))):
            i += 1
        self._unclaimed_from = i
        return i >= count

    def holds(self, index: int) -> bool:
        """Whether this worker still holds unit ``index`` (the highest generation names it)."""
        return (self.holder(index) or (0, ""))[1] == self.worker

    def alive(self, worker: str) -> bool:
        """Whether ``worker``'s heartbeat changed within the last ``dead_after_s`` seconds of this
        process's clock (or this process has not watched it that long yet)."""
        if worker == self.worker:
            return True
        try:
            beat = (self.dir / "workers" / f"{worker}.json").read_text()
        except OSError:
            beat = None
        now = time.monotonic()
        last = self._seen.get(worker)
        if last is None or last[0] != beat:
            self._seen[worker] = (beat, now)
            return True
        return now - last[1] < self.dead_after_s

    def presume_dead(self, beats: dict[str, str]) -> None:
        """Count each worker of ``beats`` (worker -> its heartbeat file's text, as another
        observer read it when it judged the worker dead: :func:`heartbeats`) as dead at once
        while its heartbeat is still that text, instead of after ``dead_after_s`` of watching it;
        a worker whose heartbeat changed since counts as alive, as usual."""
        for worker, beat in beats.items():
            try:
                now_beat = (self.dir / "workers" / f"{worker}.json").read_text()
            except OSError:
                now_beat = None
            if now_beat == beat:
                self._seen[worker] = (beat, time.monotonic() - self.dead_after_s)

    # -- claiming -------------------------------------------------------------------------------
    def _link(self, index: int, generation: int) -> bool:
        """Create generation ``generation`` of unit ``index``'s claim; False if it exists."""
        final = self.dir / _name(index, generation)
        tmp = self.dir / temporary_name(final.name)
        tmp.write_text(json.dumps({"worker": self.worker, "host": socket.gethostname(), "pid": os.getpid(),
                                   "at": time.time()}))
        try:
            os.link(tmp, final)
            self._known[index] = (generation, self.worker)
            self._names[final.name] = self.worker
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def claim(self, index: int) -> bool:
        """Claim ``index`` alone: True when this worker holds it now (it did already, nobody
        did, or its holder is dead and this worker won the takeover)."""
        held = self.holder(index)
        if held is None:
            return self._link(index, 0)
        generation, worker = held
        return worker == self.worker or (not self.alive(worker) and self._link(index, generation + 1))

    def claim_next(self, indices: Iterable[int], settled: Iterable[int] = (), limit: int | None = None,
                   exclude: Iterable[int] = (), is_settled: Callable[[int], bool] | None = None) -> int | None:
        """Claim the next unit to serve, in ``indices`` order, and return its index; None when
        nothing is left for this worker.

        Preference: a unit this worker already holds (a requeued task resumes its own), then one
        nobody holds, then one whose holder is dead (taken over). ``settled`` units (done or
        failed), those for which ``is_settled(index)`` is true (asked only of a unit about to be
        taken; once true, taken to stay true) and ``exclude`` (those this worker is already serving) are skipped; at most
        ``limit`` units are ever held by this worker (``cluster.shards_per_task``; None: no limit).

        The claims folder is listed on the first call, when ``limit`` is set, and when no unit is
        free (to find dead holders); otherwise a call looks only at the claim files of units it
        has not yet seen claimed, so a worker's calls over a run cost in all about one look at
        each unit, not one per unit per call.
        """
        settled, exclude = set(settled), set(exclude)
        order = list(indices)

        def skip(i: int) -> bool:
            if i in settled or i in exclude or i in self._settled:
                return True
            if is_settled is not None and is_settled(i):
                self._settled.add(i)  # done and failed marks are never removed within a launch
                return True
            return False

        if not self._listed or limit is not None:
            held_now = self.holders()
            mine = {i for i, (_, w) in held_now.items() if w == self.worker}
        else:
            mine = {i for i, (_, w) in self._known.items() if w == self.worker}
        for i in order:
            if i in mine and not skip(i) and self.holds(i):
                return i
        if limit is not None and len(mine) >= limit:
            return None
        for i in order:
            if i in self._known:
                continue  # claimed: a claim is never removed within a launch
            if os.path.lexists(self.dir / _name(i, 0)):
                self._known[i] = (0, None)
                continue
            if not skip(i) and self._link(i, 0):
                return i
            if i not in self._known and os.path.lexists(self.dir / _name(i, 0)):
                self._known[i] = (0, None)
        holders = self.holders()
        alive: dict[str, bool] = {}
        for i in order:
            if i not in holders:
                continue
            g, w = holders[i]
            if w not in alive:
                alive[w] = self.alive(w)
            if not alive[w] and not skip(i) and self._link(i, g + 1):
                return i
        return None

    # -- heartbeat ------------------------------------------------------------------------------
    def beat(self, ended: bool = False) -> None:
        """Write this worker's heartbeat once (a counter, so that it changes every time);
        ``ended``: its last, this worker will claim and serve nothing more."""
        self._beat += 1
        write_json(self.dir / "workers" / f"{self.worker}.json",
                   {"worker": self.worker, "beat": self._beat, "at": time.time(), "pid": os.getpid(),
                    "ended": ended})

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> "Claims":
        """Beat now and then every ``every_s`` seconds from a daemon thread, so that a worker
        blocked in a long call (an engine starting) still counts as alive."""
        self.beat()
        self._heartbeat = Heartbeat(self.beat, every_s, f"claims-heartbeat-{self.worker}").start()
        return self

    def stop_heartbeat(self) -> None:
        """Stop beating and write the last heartbeat, marked ``ended``."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            try:
                self.beat(ended=True)
            except OSError:
                pass  # then it reads as dead once its heartbeat has been still for dead_after_s


class LiveWorkers:
    """The launcher's view of the workers' heartbeats: which workers still serve the run.

    A worker is live while its heartbeat is not marked ``ended`` and has changed within
    ``dead_after_s`` seconds of this process's clock (:meth:`Claims.alive`); so one killed
    outright counts as live for up to ``dead_after_s`` after this observer first read it.
    """

    def __init__(self, run_path: str | os.PathLike, dead_after_s: float = DEAD_AFTER_S):
        self._claims = Claims(run_path, "", dead_after_s)

    def live(self) -> list[str]:
        """Ids of the live workers, sorted."""
        out = []
        for f in sorted((self._claims.dir / "workers").glob("*.json")):
            try:
                ended = json.loads(f.read_text()).get("ended", False)
            except (OSError, ValueError):
                ended = False  # half-written by a beat in flight: it lives
            if not ended and self._claims.alive(f.stem):
                out.append(f.stem)
        return out


def heartbeats(run_path: str | os.PathLike) -> dict[str, str]:
    """Worker -> its heartbeat file's text, for every worker not marked ``ended`` (what
    :meth:`Claims.presume_dead` takes)."""
    out = {}
    for f in sorted((Path(run_path) / "claims" / "workers").glob("*.json")):
        try:
            text = f.read_text()
            if not json.loads(text).get("ended", False):
                out[f.stem] = text
        except (OSError, ValueError):
            continue
    return out


def holders(run_path: str | os.PathLike, names: dict[str, str] | None = None) -> dict[int, tuple[int, str]]:
    """Every claimed index of the run at ``run_path`` -> (highest generation, worker named
    there); {} before any claim. Reads only (``pipeline.status`` uses it). ``names``: claim file
    name -> worker, the claims read before (a claim file never changes), added to."""
    folder = Path(run_path) / "claims"
    top: dict[int, int] = {}
    for name in (os.listdir(folder) if folder.is_dir() else ()):
        if m := _CLAIM.match(name):
            i, g = int(m.group(1)), int(m.group(2))
            if g > top.get(i, -1):
                top[i] = g
    names = {} if names is None else names
    return {i: (g, _read_worker(folder, _name(i, g), names)) for i, g in top.items()}


def _read_worker(folder: Path, name: str, names: dict[str, str]) -> str:
    """The worker named by claim file ``folder/name`` (read once into ``names``); "" when it
    cannot be read: a holder nobody can name counts as dead (not remembered: read again next)."""
    if name in names:
        return names[name]
    try:
        worker = json.loads((folder / name).read_text())["worker"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    names[name] = worker
    return worker


def _name(index: int, generation: int) -> str:
    return f"unit-{index:05d}.{generation}"
