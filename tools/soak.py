"""Chaos soak across hosts (issue #39 section 3): a 2P:2D run on the 4-node test Slurm while a
seeded schedule injects a fault every ``--min-gap`` to ``--max-gap`` seconds; at the end every
input row must be in the output exactly once and equal (token ids) a colocated run of the same
input.

    .venv/bin/python tools/soak.py [--rows 1200] [--shards 24] [--max-new-tokens 64] [--minutes 30]
                                   [--seed 1] [--min-gap 60] [--max-gap 120]
                                   [--kinds lost,cut,kill-prefill,preempt,cancel]
                                   [--out /tmp/soak/run] [--ref DIR] [--dry-run] [--reference-only]

Needs root and the test Slurm (``bash slurm/start-test-cluster.sh --nodes 4``: pd-node1-2 the
``prefill`` partition, pd-node3-4 ``decode``, one CPU each). It is a tool run by hand or nightly,
not part of the test suite (``tests/tools/test_soak.py`` tests its pure parts).

What it does, in order:

1. writes ``--rows`` prompts (standard-library docstrings, PSF License, each row's paragraphs
   rotated so no two rows are equal) as ``--shards`` Parquet shards under ``OUT/input``;
2. launches the P/D run (``cluster=slurm-test-nodes``, NIXL push, 2P:2D, the settings the Slurm
   fault test runs with: :data:`PD_OVERRIDES`) with ``run.wait=true``; every row generates exactly
   ``--max-new-tokens`` tokens (``ignore_eos``), so the run's length is set by rows x tokens;
3. once every engine is ready (the faults' time 0), injects the schedule (:func:`plan`), one
   line on stderr per fault and per node returned; a node lost comes back after
   :data:`LOST_S` s, a cut link heals after :data:`CUT_S` s; whatever happens, lost nodes are
   brought back and cuts healed before the tool exits;
4. follows the run (every :data:`POLL_S` s): Slurm's view of the run's jobs, engines ready
   again, decode ranks the launcher marked lost, the launcher's and workers' log lines that say
   what the pipeline did (:data:`LOG_EVENTS`); each event is put down to the last fault before it;
5. once it has ended, writes the table so far (``OUT/table.md``), then runs the same rows
   colocated, locally without Slurm (``pools=colocated``), the reference: kept in ``--ref``
   (default ``/tmp/soak/ref-<max-new-tokens>``), where only rows no earlier soak's reference
   covered are run (``--reference-only`` makes it and exits);
6. checks the output: each input id once, no error rows, token ids equal to the reference;
7. prints a Markdown table (fault, when: s since the launch, target, what the pipeline did, rows
   handed off again) and a verdict line, and writes ``OUT/soak.json`` (the arguments, the
   schedule, each fault as injected, every event, the checks, the verdict; rewritten after every
   fault, so a soak still running can be read).

The schedule (:func:`plan`) is drawn from ``--seed`` alone: the same arguments give the same
faults. Its rules keep the run recoverable, so that a failure is the pipeline's, not the
schedule's (see :func:`plan`): never two faults that take a decode rank out of service at once,
a decode rank lost for good (its job cancelled, its worker killed: the pipeline does not start
one again) at most once and only in the last third, each prefill task killed at most
``TASK_RESTARTS`` times (the launcher restarts a killed task that often). At injection a fault
whose target is not there (a task requeued and waiting) or that would leave no decode rank
serving, or a prefill worker whose engine is still starting (on this machine a start takes
longer than the gap between faults, so faults on starting workers would stop the run serving any
row), is recorded as skipped, with the reason, and not injected.

Times are seconds; ``--minutes`` is how long the schedule lasts from the faults' time 0 (size
``--rows`` x ``--max-new-tokens`` so the run lasts at least that long: faults planned after the
run has ended are listed as not reached). Exit status 0 when the verdict is PASS, 1 when not.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchlib.cli import csv_list, parser  # noqa: E402
from tools.benchlib.procs import pipeline_command, stop  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402
from tools.benchlib.tables import md_table  # noqa: E402

PREFILL_NODES = ("pd-node1", "pd-node2")  # the test Slurm's `prefill` partition (preemptible)
DECODE_NODES = ("pd-node3", "pd-node4")  # its `decode` partition: decode rank r on one of them
PREFILL_TASKS = 2
DECODE_RANKS = 2
NETFAULT = ["bash", str(ROOT / "slurm" / "netfault.sh")]

KINDS = ("lost", "cut", "kill-prefill", "kill-decode", "preempt", "cancel")
DEFAULT_KINDS = "lost,cut,kill-prefill,preempt,cancel"
LOST_S = 60.0  # a lost node is brought back after this long
CUT_S = 30.0  # a cut link heals after this long
PREEMPT_S = 5  # the preemptor job's length
# How long a fault keeps a decode rank out of service, for the rule that no two overlap: a lost
# decode node is down LOST_S, then Slurm starts its requeued job and the engine starts again
# (~2 min on this machine); a cut link is down CUT_S and hand-offs wait ack_timeout_s more; a
# rank lost for good has its rows moved to the other within decode_dead_after_s and a retry.
DECODE_OUT_S = {"lost": LOST_S + 150.0, "cut": CUT_S + 30.0, "kill-decode": 60.0, "cancel": 60.0}
PERMANENT = ("kill-decode", "cancel")  # a decode rank lost for good: the pipeline starts no other
POLL_S = 2.0
# A worker killed with SIGKILL leaves its vLLM engine processes running (re-parented to init; the
# test Slurm's proctrack/linuxproc does not follow them, a site's proctrack/cgroup would kill them
# with the job): checked this long after the kill, recorded, and killed.
ORPHAN_CHECK_S = 20.0

# The P/D run: what tests/launch/test_slurm.py's slurm_run runs with (tests/conftest.py COMMON
# and SLURM, and the overrides that make its faults survivable), on 2P:2D with NIXL push.
PD_OVERRIDES = [
    "+job=summarize", "model.dtype=float32", "run.progress=false",
    "cluster=slurm-test-nodes", "transport.ucx_tls=tcp", "transport.ucx_net_devices=eth0",
    "transport=nixl_push", "pools.prefill=2", "pools.decode=2",
    "transport.decode_dead_after_s=10", "transport.handoff_retries=3", "transport.ack_timeout_s=10",
    "job.checkpoint_rows=2", "cluster.timeout_min=600", "run.wait=true",
]
COLOCATED_OVERRIDES = ["+job=summarize", "model.dtype=float32", "run.progress=false", "pools=colocated"]

# Lines of the launcher's output and the workers' logs that say what the pipeline did: (pattern,
# label); the label is formatted with the match's groups.
LOG_EVENTS = [
    (re.compile(r"decode rank (\d+) stopped answering"),
     "a prefill worker saw decode rank {0} dead, served its hand-offs again"),
    (re.compile(r"decode rank (\d+) \(\S+\) did not acknowledge a"),
     "a prefill worker moved hand-offs off decode rank {0} (unacknowledged)"),
    (re.compile(r"decode rank (\d+) \(\S+\) answers again"), "decode rank {0} reachable again"),
    (re.compile(r"its prefill worker withdrew it"), "a decode rank dropped a withdrawn hand-off"),
    (re.compile(r"request \S+: its KV (did not arrive|could not be loaded)"),
     "a decode rank asked for a prefill again (KV {0})"),
    (re.compile(r"recomputed \d+ of its \d+ prompt tokens"), "a decode rank recomputed a prompt (KV lost)"),
    (re.compile(r"array task (\d+) started again as job (\S+)"), "launcher restarted prefill task {0} as job {1}"),
    (re.compile(r"warning: job (\S+?)\b.*its rows go to the other decode workers"),
     "launcher: decode job {0} ended, its rows go to the other rank"),
    (re.compile(r"decode rank (\d+) \((\S+)\) was lost during the run"),
     "summary: decode rank {0} lost during the run"),
    (re.compile(r"no decode worker alive and reachable"), "a prefill worker found no decode rank"),
    (re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Unavailable|Lost)): (.{0,120})"), "error: {0}: {1}"),
]
# Lines of slurmctld's log that say what Slurm did to the run's nodes and jobs.
SLURM_EVENTS = [
    (re.compile(r"error: Nodes (\S+) not responding, setting DOWN"), "Slurm set {0} DOWN (not responding)"),
    (re.compile(r"requeue job JobId=(\S+) due to failure of node (\S+)"), "Slurm requeued job {0} (node {1} failed)"),
    (re.compile(r"Registered JobId=(\S+) StepId=\S+ on wrong node (\S+)"), "a stale step of job {0} still ran on {1}"),
    (re.compile(r"preempted JobId=(\S+)"), "Slurm preempted job {0}"),
]
RETRY = re.compile(r"row (\S+): .*\(try (\d+) of (\d+)\)")


# -- the schedule (pure) -------------------------------------------------------------------------

def plan(seed: int, minutes: float, min_gap: float = 60.0, max_gap: float = 120.0,
         kinds: list[str] | tuple[str, ...] = tuple(DEFAULT_KINDS.split(",")),
         task_restarts: int = 1) -> list[dict[str, Any]]:
    """The faults, drawn from ``seed`` alone: ``[{i, at_s, kind, target, peer, decode_out}]``,
    ``at_s`` seconds after the faults' time 0, each ``min_gap`` to ``max_gap`` s after the one
    before, up to ``minutes`` x 60 s.

    Each time a kind is drawn from ``kinds``, then its target; where the drawn kind breaks a rule
    it is drawn again among the kinds that do not (and where none does, the fault waits until the
    rule allows one, the only case of a gap above ``max_gap``). The rules:

    - ``decode_out``: faults that take a decode rank out of service (a decode node lost, a link
      between a prefill and a decode node cut, a decode worker killed or its job cancelled) never
      overlap: each keeps its rank out for :data:`DECODE_OUT_S` s;
    - one that loses a rank for good (``PERMANENT``: the pipeline starts no other) at most
      ``DECODE_RANKS - 1`` times, in the last third only; after it, the rank left alone still
      gets lost and cut, which it comes back from (prefill workers wait up to
      ``transport.connect_timeout_s``, 600 s, for a reachable decode rank);
    - ``kill-prefill`` of each prefill task at most ``task_restarts`` times (the launcher starts
      a killed task again that often);
    - a node is not lost again before it is back and its work restarted.
    """
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    if not 0 < min_gap <= max_gap:
        raise ValueError(f"need 0 < min_gap <= max_gap, got {min_gap}, {max_gap}")
    rng = random.Random(seed)
    end = minutes * 60.0
    decode_free_at, permanent_left = 0.0, DECODE_RANKS - 1
    node_free_at = {n: 0.0 for n in (*PREFILL_NODES, *DECODE_NODES)}
    kills = Counter()
    out: list[dict[str, Any]] = []
    t = 0.0

    def options(kind: str, at: float) -> list[dict[str, Any]]:
        """The targets ``kind`` may have at ``at``."""
        decode_ok = at >= decode_free_at
        if kind == "lost":
            nodes = [n for n in PREFILL_NODES if node_free_at[n] <= at]
            if decode_ok:
                nodes += [n for n in DECODE_NODES if node_free_at[n] <= at]
            return [{"target": n, "decode_out": n in DECODE_NODES} for n in nodes]
        if kind == "cut":
            return [{"target": p, "peer": d, "decode_out": True}
                    for p in PREFILL_NODES for d in DECODE_NODES if decode_ok and node_free_at[p] <= at]
        if kind == "kill-prefill":
            return [{"target": f"prefill-{k}", "decode_out": False}
                    for k in range(PREFILL_TASKS) if kills[k] < task_restarts]
        if kind == "preempt":
            return [{"target": n, "decode_out": False} for n in PREFILL_NODES if node_free_at[n] <= at]
        # kill-decode, cancel: permanent
        if decode_ok and permanent_left > 0 and at >= end * 2 / 3:
            return [{"target": f"decode-{r}", "decode_out": True} for r in range(DECODE_RANKS)]
        return []

    while True:
        t += rng.uniform(min_gap, max_gap)
        kind = rng.choice(list(kinds))
        ok = options(kind, t)
        if not ok:
            open_kinds = [k for k in kinds if options(k, t)]
            if not open_kinds:
                # Nothing allowed now: wait for the first moment something is.
                waits = [x for x in (decode_free_at, end * 2 / 3, *node_free_at.values()) if t < x < float("inf")]
                if not waits:
                    break  # nothing will ever be allowed again
                t = min(waits)
                open_kinds = [k for k in kinds if options(k, t)]
                if not open_kinds:
                    continue
            kind = rng.choice(open_kinds)
            ok = options(kind, t)
        if t > end:
            break
        fault = {"i": len(out) + 1, "at_s": round(t, 1), "kind": kind, "peer": None, **rng.choice(ok)}
        if kind == "lost":
            node_free_at[fault["target"]] = t + DECODE_OUT_S["lost"]
        if kind == "preempt":
            node_free_at[fault["target"]] = t + PREEMPT_S + 60.0  # requeued, engine started again
        if kind == "kill-prefill":
            kills[int(fault["target"].split("-")[1])] += 1
        if fault["decode_out"]:
            if kind in PERMANENT:
                permanent_left -= 1
            decode_free_at = t + DECODE_OUT_S[kind]
        out.append(fault)
    return out


def describe(fault: dict[str, Any]) -> str:
    """A fault in words: ``lost pd-node4``, ``cut pd-node2 <-> pd-node3 30 s``."""
    if fault["kind"] == "cut":
        return f"cut {fault['target']} <-> {fault['peer']} {CUT_S:g} s"
    if fault["kind"] == "lost":
        return f"lost {fault['target']} for {LOST_S:g} s"
    return f"{fault['kind']} {fault['target']}"


# -- the table and the verdict (pure) ------------------------------------------------------------

def attribute(faults: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each event (``{"t", ...}``, seconds since the launch) put down to the last fault injected
    (not skipped) at or before it (``faults``' ``t``, also since the launch): fault number -> its events; events
    before the first fault under 0."""
    injected = sorted((f["t"], f["i"]) for f in faults if f.get("t") is not None and not f.get("skipped"))
    out: dict[int, list[dict[str, Any]]] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        owner = 0
        for t, i in injected:
            if t <= e["t"]:
                owner = i
        out.setdefault(owner, []).append(e)
    return out


def did(events: list[dict[str, Any]]) -> str:
    """What the pipeline did, from a fault's events: each label once, in order of first
    appearance, with a count where it came more than once; ``-`` for none."""
    counts = Counter(e["what"] for e in events if e["what"])
    seen = list(dict.fromkeys(e["what"] for e in events if e["what"]))
    return "; ".join(f"{w} (x{counts[w]})" if counts[w] > 1 else w for w in seen) or "-"


def served_again(events: list[dict[str, Any]]) -> int:
    """Rows handed off again (distinct row keys of the retry lines) among ``events``."""
    return len({e["row"] for e in events if e.get("row")})


def table(result: dict[str, Any]) -> str:
    """The Markdown table of a soak's ``result`` (see :func:`verdict` for its keys): one row per
    planned fault (injected, skipped with its reason, or not reached as the run had ended), and
    first a row ``0`` for what happened before the first fault, when anything did."""
    by_fault = attribute(result["faults"], result["events"])
    rows = []
    if by_fault.get(0):
        rows.append([0, "(none yet)", "-", "-", did(by_fault[0]), served_again(by_fault[0])])
    for f in result["faults"]:
        evs = by_fault.get(f["i"], [])
        when = f"{f['t']:.0f}" if f.get("t") is not None else "-"
        if f.get("skipped"):
            what = f"not injected: {f['skipped']}"
        else:
            what = did(evs)
        rows.append([f["i"], f["kind"], when, f.get("resolved") or describe(f), what,
                     "-" if f.get("skipped") or f.get("t") is None else served_again(evs)])
    return md_table(["#", "fault", "when (s)", "target", "what the pipeline did", "rows handed off again"],
                    rows, "rlrllr")


def verdict(result: dict[str, Any]) -> tuple[bool, str]:
    """(passed, one line) from ``result``: ``rc`` (the launcher's exit status), ``check``
    (``rows``, ``missing``, ``duplicated``, ``errors``, ``differ``, ``compared``: see
    :func:`check_output`), ``faults`` (each with ``t`` once injected, or ``skipped``).
    Passed: the launcher exited 0 and every row is there once, without error, equal to the
    colocated run."""
    c, faults = result["check"], result["faults"]
    injected = sum(1 for f in faults if f.get("t") is not None and not f.get("skipped"))
    skipped = sum(1 for f in faults if f.get("skipped"))
    problems = []
    if result["rc"] != 0:
        problems.append(f"the launcher exited {result['rc']}")
    for key, words in (("missing", "missing"), ("duplicated", "more than once"), ("errors", "error rows"),
                       ("differ", "differ from the colocated run")):
        if c.get(key):
            problems.append(f"{c[key]} rows {words}")
    if c.get("compared", 0) < c.get("rows", 0) and not problems:
        problems.append(f"only {c.get('compared', 0)} of {c['rows']} rows compared")
    passed = not problems
    head = "PASS" if passed else "FAIL"
    line = (f"verdict: {head}: {c.get('rows', 0)} input rows, {c.get('compared', 0)} in the output once and equal "
            f"to the colocated run; {injected} faults injected, {skipped} skipped")
    if problems:
        line += "; " + "; ".join(problems)
    return passed, line


# -- inputs, the reference and the output check --------------------------------------------------

@functools.lru_cache(maxsize=1)
def _docs() -> list[tuple[str, str]]:
    """(module, docstring clipped to <= 1200 characters) of the standard library's modules."""
    from tools.bench_parts.e2e.inputs import _stdlib_docstrings
    from tools.make_sample_data import clip

    return [(m, clip(d, 1200)) for m, d in _stdlib_docstrings()]


def write_inputs(folder: Path, rows: int, shards: int, start: int = 0) -> list[str]:
    """``rows`` prompt rows (rows ``start`` to ``start + rows - 1``) over ``shards`` Parquet
    shards in ``folder`` (``part-NNNNN.parquet``;
    columns ``id``, ``module``, ``text``): standard-library module docstrings
    (:func:`tools.bench_parts.e2e.inputs._stdlib_docstrings`, clipped to <= 1200 characters),
    row ``i`` the ``i mod D``-th of D documents with its paragraphs rotated by ``i div D`` and
    numbered, so that no two rows are the same and a row's text depends on ``i`` alone (the
    first N rows of a bigger input are the same rows). Returns the ids in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _docs()
    folder.mkdir(parents=True, exist_ok=True)
    recs = []
    for i in range(start, start + rows):
        module, doc = docs[i % len(docs)]
        paras = doc.split("\n\n")
        k = (i // len(docs)) % len(paras)
        text = f"Note {i // len(docs) + 1} on the {module} module.\n\n" + "\n\n".join(paras[k:] + paras[:k])
        recs.append({"id": f"soak-{i:06d}", "module": module, "text": text})
    per = [rows // shards + (1 if s < rows % shards else 0) for s in range(shards)]
    at = 0
    for s, n in enumerate(per):
        pq.write_table(pa.Table.from_pylist(recs[at:at + n]), folder / f"part-{s:05d}.parquet")
        at += n
    return [r["id"] for r in recs]


def read_output(folder: Path) -> list[dict[str, Any]]:
    """Every row of the output shards under ``folder``: ``{id, generation_token_ids, error}``."""
    import pyarrow.parquet as pq

    out = []
    for p in sorted(folder.rglob("*.parquet")):
        out += pq.read_table(p, columns=["id", "generation_token_ids", "error"]).to_pylist()
    return out


def check_output(ids: list[str], rows: list[dict[str, Any]], reference: dict[str, Any]) -> dict[str, Any]:
    """Each of ``ids`` once in ``rows`` (the P/D output), without error and with the token ids of
    ``reference`` (id -> token ids, the colocated run): counts of rows ``missing``, ``duplicated``
    (in the output more than once), ``extra`` (not an input id), ``errors``, ``differ`` (not
    equal to the reference, or not in it), ``compared`` (equal); and up to 5 ids of each."""
    seen = Counter(r["id"] for r in rows)
    want = set(ids)
    missing = [i for i in ids if i not in seen]
    dup = sorted(i for i, n in seen.items() if n > 1)
    extra = sorted(i for i in seen if i not in want)
    errors = sorted({r["id"] for r in rows if r["error"] is not None})
    differ = sorted({r["id"] for r in rows if r["id"] in want and reference.get(r["id"]) != r["generation_token_ids"]})
    compared = sum(1 for i in ids if seen.get(i) == 1 and i not in differ and i not in errors)
    return {"rows": len(ids), "output_rows": len(rows), "missing": len(missing), "duplicated": len(dup),
            "extra": len(extra), "errors": len(errors), "differ": len(differ), "compared": compared,
            "examples": {"missing": missing[:5], "duplicated": dup[:5], "extra": extra[:5], "errors": errors[:5],
                         "differ": differ[:5]}}


def colocated_reference(ref: Path, rows: int, shards: int, max_new_tokens: int) -> dict[str, Any]:
    """id -> token ids of the colocated run (``pools=colocated``, locally, without Slurm) of the
    first ``rows`` rows of :func:`write_inputs` with ``max_new_tokens``.

    Kept in ``ref`` as parts, each a run over rows ``[start, end)`` (``ref/rows-START-END/``:
    ``input``, ``output``, ``run``, ``stdout.txt``, ``stderr.txt``), listed in ``ref/done.json``
    once it succeeded; a row's text depends on its index alone, so rows a part covers already
    are read from it, and only the rows beyond every part are run (one more part)."""
    ref.mkdir(parents=True, exist_ok=True)
    marker = ref / "done.json"
    done = read_json(marker) or {"max_new_tokens": max_new_tokens, "parts": []}
    if done["max_new_tokens"] != max_new_tokens:
        raise SystemExit(f"{ref} holds a reference of {done['max_new_tokens']} tokens a row; give another --ref")
    have = max((end for _, end in done["parts"]), default=0)
    if have < rows:
        part = ref / f"rows-{have}-{rows}"
        log(f"colocated reference: running rows {have}-{rows} into {part}")
        write_inputs(part / "input", rows - have, max(1, round(shards * (rows - have) / rows)), start=have)
        t = time.time()
        with open(part / "stdout.txt", "w") as out, open(part / "stderr.txt", "w") as err:
            p = subprocess.run(pipeline_command(*COLOCATED_OVERRIDES, *sampling(max_new_tokens),
                                                f"job.input={part / 'input'}", f"job.output={part / 'output'}",
                                                f"run.dir={part / 'run'}"), cwd=ROOT, stdout=out, stderr=err)
        if p.returncode != 0:
            raise SystemExit(f"the colocated reference failed (exit {p.returncode}); see {part}/stderr.txt")
        done["parts"].append([have, rows])
        done.setdefault("wall_s", {})[part.name] = round(time.time() - t, 1)
        write_json(marker, done)
    out = {}
    for start, end in done["parts"]:
        out.update({r["id"]: r["generation_token_ids"] for r in read_output(ref / f"rows-{start}-{end}" / "output")})
    return out


def sampling(max_new_tokens: int) -> list[str]:
    """Every row generates exactly ``max_new_tokens`` tokens (greedy, past EOS)."""
    return [f"job.sampling.max_new_tokens={max_new_tokens}", "job.sampling.ignore_eos=true"]


# -- the run's state, read from the run directory and Slurm --------------------------------------

def log(msg: str) -> None:
    print(f"soak {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def job_names(run_dir: Path) -> dict[str, str]:
    """Slurm job id -> ``prefill task K`` / ``decode rank R``, from ``RUN_DIR/jobs.json``
    (array tasks in task order, decode jobs in rank order: one rank a job here)."""
    jobs = read_json(run_dir / "jobs.json") or {}
    names = {j: f"prefill task {k}" for k, j in enumerate(jobs.get("array_tasks", []))}
    names.update({j: f"decode rank {r}" for r, j in enumerate(jobs.get("decode", []))})
    return names


def squeue(ids: list[str]) -> dict[str, tuple[str, str]]:
    """Job id -> (state, node list) of those of ``ids`` Slurm lists (array task ids as
    ``JOB_TASK``)."""
    if not ids:
        return {}
    p = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T %N", "-j", ",".join(ids)],
                       capture_output=True, text=True, timeout=30)
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def slurmctld_log() -> Path | None:
    """slurmctld's log file (``scontrol show config``), where this process can read it."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", out, re.M)
    return Path(m.group(1)) if m and Path(m.group(1)).is_file() else None


def drained() -> list[tuple[str, str]]:
    """(node, reason) of the test nodes Slurm has drained (not those down: a lost node comes back
    by itself once its slurmd registers)."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-t", "drain,drained,draining", "-o", "%N|%E"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = {tuple(line.split("|", 1)) for line in out.splitlines() if "|" in line}
    return sorted((n, r) for n, r in rows if n in (*PREFILL_NODES, *DECODE_NODES))


def held(ids: list[str]) -> list[str]:
    """Those of job ``ids`` Slurm holds after a failed launch (``launch_failed_requeued_held``)."""
    if not ids:
        return []
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i %r", "-j", ",".join(ids)], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    # squeue's %r spells the reason with spaces ("launch failed requeued held").
    return [line.split()[0] for line in out.splitlines() if "launch failed requeued held" in line.replace("_", " ")]


def node_pids(node: str) -> list[int]:
    p = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True, timeout=30)
    return [int(x) for x in p.stdout.split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_state(pid: int) -> str:
    """``gone`` (no such process, or a zombie: it has ended), ``ending`` (killed: SIGKILL pending,
    or exiting, the kernel freeing its memory, which took over 20 s for an engine's KV cache on
    this machine under load) or ``running``; from ``/proc/PID/stat`` (state, and flags'
    ``PF_EXITING`` = 0x4, linux/sched.h) and ``/proc/PID/status`` (``SigPnd``/``ShdPnd``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "gone"
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ... flags (6th)
    if fields[0] in ("Z", "X"):
        return "gone"
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    exiting = int(fields[6]) & 0x4
    return "ending" if exiting or pending & (1 << (signal.SIGKILL - 1)) else "running"


def worker_pid(node: str) -> int | None:
    """The pid of the worker process (submitit's ``_submit``) running in ``node``'s namespace."""
    for pid in node_pids(node):
        if "submitit.core._submit" in cmdline(pid):
            return pid
    return None


def decode_serving(run_dir: Path, rank: int, fresh_s: float = 10.0) -> bool:
    """Whether decode ``rank``'s endpoint record has a heartbeat within ``fresh_s`` s and is not
    marked stopped."""
    rec = read_json(run_dir / "decode" / f"rank-{rank}.json")
    return bool(rec) and not rec.get("stopped") and time.time() - (rec.get("heartbeat") or 0) < fresh_s


def decode_node(run_dir: Path, rank: int) -> str | None:
    rec = read_json(run_dir / "decode" / f"rank-{rank}.json")
    return rec["worker"].split("@")[1] if rec and "@" in rec.get("worker", "") else None


class Watcher:
    """Follows the run: every call of :meth:`poll` adds to ``events`` what changed since the one
    before (``{"t": s since the launch, "what": label, "row": key (retry lines only), "source"}``)."""

    def __init__(self, run_dir: Path, launcher_out: list[Path], t0: float):
        self.run_dir, self.launcher_out, self.t0 = run_dir, launcher_out, t0
        self.events: list[dict[str, Any]] = []
        self.offsets: dict[Path, int] = {}
        self.states: dict[str, tuple[str, str]] = {}
        self.ready: dict[str, float] = {}
        self.lost: dict[str, str] = {}
        self.last_squeue = 0.0
        self.machine: dict[str, Any] = {}
        self.slurmctld_log = slurmctld_log()
        if self.slurmctld_log is not None:  # only what is written from now on
            self.offsets[self.slurmctld_log] = self.slurmctld_log.stat().st_size

    def add(self, what: str, source: str, row: str | None = None) -> None:
        self.events.append({"t": round(time.time() - self.t0, 1), "what": what, "row": row, "source": source})

    def poll(self) -> None:
        self._machine()
        self._lines()
        self._engines()
        lost = read_json(self.run_dir / "decode" / "lost.json") or {}
        for r, w in lost.items():
            if self.lost.get(r) != w:
                self.add(f"launcher marked decode rank {r} ({w}) lost", "decode/lost.json")
        self.lost = dict(lost)
        if time.monotonic() - self.last_squeue >= 5:
            self.last_squeue = time.monotonic()
            self._slurm()

    def _machine(self) -> None:
        """The machine's worst moments so far: the highest 1-minute load average and the least
        memory available (MiB), in ``self.machine``."""
        try:
            load = float(Path("/proc/loadavg").read_text().split()[0])
            avail = int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) // 1024
        except (OSError, AttributeError, ValueError):
            return
        m = self.machine
        m["max_load_1m"] = max(m.get("max_load_1m", 0.0), load)
        m["min_mem_available_mib"] = min(m.get("min_mem_available_mib", avail), avail)
        m["cores"] = os.cpu_count()

    def _lines(self) -> None:
        files = [*self.launcher_out, *sorted((self.run_dir / "logs").glob("*/*_log.*")),
                 *([self.slurmctld_log] if self.slurmctld_log else [])]
        for f in files:
            try:
                with open(f, "rb") as fh:
                    fh.seek(self.offsets.get(f, 0))
                    data = fh.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1  # whole lines only
            self.offsets[f] = self.offsets.get(f, 0) + cut
            for line in data[:cut].decode(errors="replace").splitlines():
                self._line(line.strip(), f.name)

    def _line(self, line: str, source: str) -> None:
        if self.slurmctld_log is not None and source == self.slurmctld_log.name:
            for pattern, label in SLURM_EVENTS:
                if m := pattern.search(line):
                    self.add(label.format(*m.groups()), "slurmctld")
            return
        if m := RETRY.search(line):
            self.add("", source, row=m.group(1))
        for pattern, label in LOG_EVENTS:
            if m := pattern.search(line):
                self.add(label.format(*m.groups()), source)
                break

    def _engines(self) -> None:
        for p in sorted((self.run_dir / "engines").glob("*.json")):
            rec = read_json(p)
            if not rec:
                continue
            worker, ready = rec.get("worker", p.stem), rec.get("ready_at")
            if worker in self.ready and self.ready[worker] != ready:
                self.add(f"{worker} engine ready again", "engines")
            elif worker not in self.ready and self.ready:
                task = worker.split("@")[0]
                if any(w.split("@")[0] == task for w in self.ready):
                    self.add(f"{worker} engine ready again (moved node)", "engines")
            self.ready[worker] = ready

    def _slurm(self) -> None:
        names = job_names(self.run_dir)
        try:
            now = squeue(list(names))
        except (OSError, subprocess.TimeoutExpired):
            return
        for job, name in names.items():
            state = now.get(job, ("gone", ""))
            before = self.states.get(job)
            if before is not None and before != state:
                where = f" on {state[1]}" if state[1] and state[0] == "RUNNING" else ""
                self.add(f"{name} {before[0].lower()} -> {state[0].lower()}{where}", "squeue")
            self.states[job] = state


# -- injecting faults ----------------------------------------------------------------------------

def run_cmd(cmd: list[str]) -> str:
    """Run ``cmd``; '' when it succeeded, else its error output."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return "" if p.returncode == 0 else (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}")[-300:]


class Injector:
    """Injects faults on the run at ``run_dir`` and undoes the lasting ones (:meth:`tick` brings
    lost nodes back when due, :meth:`restore` brings back every node lost and heals every cut)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.back_at: dict[str, float] = {}  # node lost -> when it comes back (time.monotonic())
        self.cut: set[tuple[str, str]] = set()
        self.gone: set[int] = set()  # decode ranks lost for good (killed, cancelled) by this soak
        self.drain_checked = 0.0
        self.orphans: list[tuple[float, int, list[int]]] = []  # (when to check, killed pid, its descendants)

    def inject(self, f: dict[str, Any]) -> tuple[str | None, str | None]:
        """Inject ``f``: (what was done, None) or (None, why it was skipped)."""
        kind, target = f["kind"], f["target"]
        if kind in ("lost", "cut") and (target in self.back_at or f.get("peer") in self.back_at):
            return None, "its node is lost already"
        if f["decode_out"]:
            if kind in ("lost", "cut"):
                target, why = self._serving_decode_node(f)
                if target is None:
                    return None, why
                if kind == "cut":
                    f = {**f, "peer": target}
                    target = f["target"]
                else:
                    f = {**f, "target": target}
            rank = self._decode_rank(f)
            others = [r for r in range(DECODE_RANKS) if r != rank and decode_serving(self.run_dir, r)]
            if not others and (kind in PERMANENT or set(range(DECODE_RANKS)) - {rank} - self.gone):
                # A rank the pipeline lost for good leaves the other alone: a fault it comes back
                # from may take that one out; else another outage would overlap this one.
                stale = ", ".join(str(r) for r in range(DECODE_RANKS) if r != rank)
                return None, (f"no decode rank but {rank} is serving now (the heartbeat of {stale} is older "
                              f"than 10 s): it would leave none" + ("" if kind in PERMANENT else " for a while"))
        if kind == "lost":
            if err := run_cmd([*NETFAULT, target, "lost"]):
                return None, f"netfault failed: {err}"
            self.back_at[target] = time.monotonic() + LOST_S
            return f"lost {target} for {LOST_S:g} s{self._holds(target)}", None
        if kind == "cut":
            if err := run_cmd([*NETFAULT, target, "cut", f["peer"], f"{CUT_S:g}"]):
                return None, f"netfault failed: {err}"
            self.cut.add((target, f["peer"]))
            return f"cut {target} <-> {f['peer']} ({self._holds(f['peer']).strip(' ()')}) for {CUT_S:g} s", None
        if kind == "preempt":
            node = target
            if not self._prefill_serving(node):
                node = next((n for n in PREFILL_NODES if self._prefill_serving(n)), None)
                if node is None:
                    return None, "no prefill task with its engine ready (each is starting or waiting)"
            p = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-w", node, "-o", "/dev/null",
                                "-J", "soak-preemptor", "--wrap", f"sleep {PREEMPT_S}"],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                return None, f"sbatch failed: {p.stderr.strip()[-300:]}"
            return f"preempt {node}{self._holds(node)} (job {p.stdout.strip()})", None
        if kind == "kill-prefill":
            task = target.split("-")[1]
            beat = read_json(self.run_dir / "claims" / "workers" / f"prefill-{task}.json") or {}
            pid = beat.get("pid")
            if not pid or beat.get("ended") or not Path(f"/proc/{pid}").exists():
                return None, f"prefill task {task} is not running (pid {pid})"
            node = next((n for n in PREFILL_NODES if pid in node_pids(n)), "?")
            if not self._prefill_serving(node):
                return None, f"prefill task {task}'s engine is not ready yet (pid {pid} on {node} starting)"
            self._kill(pid)
            return f"kill -9 prefill-{task} (pid {pid} on {node})", None
        if kind == "kill-decode":
            rank = int(target.split("-")[1])
            node = decode_node(self.run_dir, rank)
            pid = worker_pid(node) if node else None
            if pid is None:
                return None, f"no worker process of decode rank {rank} found (node {node})"
            self._kill(pid)
            self.gone.add(rank)
            return f"kill -9 decode-{rank} (pid {pid} on {node})", None
        if kind == "cancel":
            rank = int(target.split("-")[1])
            jobs = (read_json(self.run_dir / "jobs.json") or {}).get("decode", [])
            if rank >= len(jobs):
                return None, f"no job of decode rank {rank} in jobs.json"
            if err := run_cmd(["scancel", jobs[rank]]):
                return None, f"scancel failed: {err}"
            self.gone.add(rank)
            return f"scancel {jobs[rank]} (decode rank {rank} on {decode_node(self.run_dir, rank)})", None
        raise ValueError(kind)

    def _kill(self, pid: int) -> None:
        """SIGKILL the worker ``pid``, and note its descendants (its vLLM engine) for
        :meth:`tick` to check on :data:`ORPHAN_CHECK_S` s later."""
        import psutil

        try:
            kids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            kids = []
        os.kill(pid, signal.SIGKILL)
        self.orphans.append((time.monotonic() + ORPHAN_CHECK_S, pid, kids))

    def _serving_decode_node(self, f: dict[str, Any]) -> tuple[str | None, str]:
        """The decode node a lost or cut fault ``f`` hits: the one planned while a decode rank
        serves there, else the node of one that serves (a rank may have moved or be gone)."""
        planned = f["peer"] if f["kind"] == "cut" else f["target"]
        serving = {decode_node(self.run_dir, r): r for r in range(DECODE_RANKS) if decode_serving(self.run_dir, r)}
        if planned in serving:
            return planned, ""
        if serving:
            return sorted(serving)[0], ""
        return None, "no decode rank is serving"

    def _decode_rank(self, f: dict[str, Any]) -> int | None:
        node = f["peer"] if f["kind"] == "cut" else f["target"]
        if node.startswith("decode-"):
            return int(node.split("-")[1])
        return next((r for r in range(DECODE_RANKS) if decode_node(self.run_dir, r) == node), None)

    def _holds(self, node: str) -> str:
        """`` (decode rank R)`` / `` (prefill task K)``: what runs on ``node`` now, as Slurm says,
        else as the run directory says (an engine record stays behind when its task moves)."""
        names = job_names(self.run_dir)
        try:
            running = [names[j] for j, (state, nodes) in squeue(list(names)).items()
                       if state == "RUNNING" and nodes == node and j in names]
        except (OSError, subprocess.TimeoutExpired):
            running = []
        if running:
            return f" ({', '.join(running)})"
        for r in range(DECODE_RANKS):
            if decode_node(self.run_dir, r) == node:
                return f" (decode rank {r})"
        for p in (self.run_dir / "engines").glob(f"prefill-*@{node}.json"):
            return f" ({p.stem.split('@')[0]})"
        return ""

    def _prefill_serving(self, node: str) -> bool:
        """Whether a prefill worker runs on ``node`` whose engine is ready: its engine record
        (``RUN_DIR/engines/prefill-K@NODE.json``) is newer than the worker process. A fault on a
        worker still starting its engine (2-5 min on this machine under load, longer than the
        gap between faults) would keep the run from ever serving a row."""
        import psutil

        pid = worker_pid(node)
        if pid is None:
            return False
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return False
        ready = [(read_json(p) or {}).get("ready_at") or 0
                 for p in (self.run_dir / "engines").glob(f"prefill-*@{node}.json")]
        return any(r >= started for r in ready)

    def tick(self) -> list[str]:
        """Bring back the lost nodes whose time has come, end the engines a killed worker left
        behind, and every 30 s resume the test nodes Slurm drained (``Kill task failed``: a
        step's processes outlived ``UnkillableStepTimeout``; ``Duplicate jobid``) and release the
        run's jobs Slurm holds (``launch_failed_requeued_held``: a requeued job whose step could
        not start), all seen on this machine under load, as a site's administrator would; returns
        what it did (``pd-node1 back``, ``resumed pd-node2 (drained: Kill task failed)``)."""
        done = []
        for n in [n for n, at in self.back_at.items() if time.monotonic() >= at]:
            err = run_cmd([*NETFAULT, n, "back"])
            done.append(f"{n} back{' (netfault: ' + err + ')' if err else ''}")
            del self.back_at[n]
        for entry in [o for o in self.orphans if time.monotonic() >= o[0]]:
            self.orphans.remove(entry)
            _, pid, kids = entry
            states = {k: process_state(k) for k in kids}
            alive = [k for k, state in states.items() if state == "running"]
            ending = [k for k, state in states.items() if state == "ending"]
            for k in alive:
                try:
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
            if alive:
                done.append(f"{len(alive)} engine processes of killed pid {pid} outlived it {ORPHAN_CHECK_S:g} s "
                            f"(pids {', '.join(map(str, alive))}); killed, as Slurm's proctrack/cgroup would")
            if ending:
                done.append(f"{len(ending)} engine processes of killed pid {pid} were killed but still freeing their "
                            f"memory {ORPHAN_CHECK_S:g} s later (pids {', '.join(map(str, ending))})")
        if time.monotonic() - self.drain_checked > 30:
            self.drain_checked = time.monotonic()
            for node, reason in drained():
                if node not in self.back_at and not run_cmd(["scontrol", "update", f"nodename={node}", "state=resume"]):
                    done.append(f"resumed {node} (drained: {reason})")
            for job in held(list(job_names(self.run_dir))):
                if not run_cmd(["scontrol", "release", job]):
                    done.append(f"released job {job} ({job_names(self.run_dir)[job]}: launch failed, requeued held)")
        for line in done:
            log(line)
        return done

    def restore(self) -> None:
        for entry in list(self.orphans):
            for k in entry[2]:
                try:
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
        self.orphans.clear()
        for n in list(self.back_at):
            run_cmd([*NETFAULT, n, "back"])
            log(f"{n} back (restore)")
        self.back_at.clear()
        for a, b in self.cut:
            run_cmd([*NETFAULT, a, "heal", b])
        self.cut.clear()


# -- the soak ------------------------------------------------------------------------------------

def ref_path(args) -> Path:
    return Path(args.ref or f"/tmp/soak/ref-{args.max_new_tokens}")


def soak(args, schedule: list[dict[str, Any]]) -> dict[str, Any]:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    inputs = out / "input"
    ids = write_inputs(inputs, args.rows, args.shards)

    run_dir, output = out / "run", out / "output"
    if run_dir.exists() or output.exists():
        raise SystemExit(f"{run_dir} or {output} exists already: give a fresh --out")
    cmd = pipeline_command(*PD_OVERRIDES, *sampling(args.max_new_tokens), f"job.input={inputs}",
                           f"job.output={output}", f"run.dir={run_dir}")
    result: dict[str, Any] = {"args": vars(args), "command": " ".join(cmd), "schedule": schedule,
                              "faults": [dict(f) for f in schedule], "events": [], "rc": None,
                              "check": {}, "verdict": None}
    stdout, stderr = out / "launcher.stdout.txt", out / "launcher.stderr.txt"
    t0 = time.time()
    log(f"launching the P/D run: {run_dir} (launcher output in {out})")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout.open("w"), stderr=stderr.open("w"))
    watcher, injector = Watcher(run_dir, [stdout, stderr], t0), Injector(run_dir)
    result["events"], result["machine"] = watcher.events, watcher.machine
    faults_t0 = None
    pending = list(result["faults"])
    saved = time.monotonic()
    try:
        while proc.poll() is None:
            watcher.poll()
            for what in injector.tick():
                watcher.add(f"(soak: {what})", "soak")
            if faults_t0 is None:
                engines = [p.stem for p in (run_dir / "engines").glob("*.json")]
                if sum(e.startswith("prefill-") for e in engines) >= PREFILL_TASKS and \
                        sum(e.startswith("decode-") for e in engines) >= DECODE_RANKS:
                    faults_t0 = time.time()
                    result["faults_t0_s"] = round(faults_t0 - t0, 1)
                    log(f"every engine ready {faults_t0 - t0:.0f} s after the launch: faults start")
            elif pending and time.time() - faults_t0 >= pending[0]["at_s"]:
                f = pending.pop(0)
                f["t"] = round(time.time() - t0, 1)
                done, skipped = injector.inject(f)
                f["resolved"], f["skipped"] = done, skipped
                log(f"fault {f['i']}/{len(schedule)} at {f['t']:.0f} s: " +
                    (done if done else f"{describe(f)} not injected: {skipped}"))
                write_json(out / "soak.json", result)
            if time.monotonic() - saved > 30:
                saved = time.monotonic()
                write_json(out / "soak.json", result)
            time.sleep(POLL_S)
        result["rc"] = proc.returncode
    except KeyboardInterrupt:
        log("interrupted: stopping the run")
        result["rc"] = "interrupted"
        for f in pending:
            f["skipped"] = "not reached: the soak was stopped"
        raise
    finally:
        injector.restore()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the launcher cancels its jobs
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop(proc)
            jobs = read_json(run_dir / "jobs.json") or {}
            ids_left = [*jobs.get("array_tasks", []), *jobs.get("decode", [])]
            if ids_left:
                subprocess.run(["scancel", *ids_left], capture_output=True, timeout=60)
        write_json(out / "soak.json", result)
        (out / "table.md").write_text(table(result) + "\n")
    time.sleep(1)
    watcher.poll()
    for f in pending:
        f["skipped"] = "not reached: the run had ended"
    result["wall_s"] = round(time.time() - t0, 1)
    log(f"the run ended after {result['wall_s']:.0f} s, exit status {result['rc']}")
    for name, mod in (("status", "pipeline.status"), ("report", "pipeline.report")):
        p = subprocess.run([sys.executable, "-m", mod, str(run_dir)], cwd=ROOT, capture_output=True, text=True)
        (out / f"{name}.txt").write_text(p.stdout + p.stderr)
    result["tries"] = handoff_tries(run_dir)
    (out / "table.md").write_text(table(result) + "\n")
    write_json(out / "soak.json", result)
    log(f"the faults' table is in {out / 'table.md'}; now the colocated reference")
    # The reference runs after the P/D run (one run at a time on this machine): the table is
    # there before it.
    reference = colocated_reference(ref_path(args), args.rows, args.shards, args.max_new_tokens)
    result["check"] = check_output(ids, read_output(output) if output.exists() else [], reference)
    passed, line = verdict(result)
    result["verdict"], result["passed"] = line, passed
    write_json(out / "soak.json", result)
    return result


def handoff_tries(run_dir: Path) -> dict[str, int]:
    """From the request metrics: rows by how many times they were prefilled (``tries``)."""
    from pipeline.io.metrics import read_request_metrics

    try:
        tries = read_request_metrics(run_dir).column("tries").to_pylist()
    except Exception as exc:  # no metrics: say so, do not fail the soak's report
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {str(k): v for k, v in sorted(Counter(tries).items(), key=lambda kv: (kv[0] is None, kv[0] or 0))}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, prog="tools/soak.py")
    ap.add_argument("--rows", type=int, default=1200, help="input rows (default 1200)")
    ap.add_argument("--shards", type=int, default=24, help="input shards (default 24)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens each row generates (default 64)")
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the schedule lasts (default 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-gap", type=float, default=60.0, help="seconds between faults, at least (default 60)")
    ap.add_argument("--max-gap", type=float, default=120.0, help="seconds between faults, at most (default 120)")
    ap.add_argument("--kinds", default=DEFAULT_KINDS, help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--out", default="/tmp/soak/run", help="a fresh folder for the run and its results")
    ap.add_argument("--ref", default=None, help="the colocated reference's folder (reused when there)")
    ap.add_argument("--dry-run", action="store_true", help="print the schedule and exit")
    ap.add_argument("--reference-only", action="store_true",
                    help="run (or find) the colocated reference of --rows and exit")
    args = ap.parse_args(argv)
    from pipeline.launch.watch import TASK_RESTARTS

    try:
        schedule = plan(args.seed, args.minutes, args.min_gap, args.max_gap, csv_list(args.kinds), TASK_RESTARTS)
    except ValueError as exc:
        ap.error(str(exc))
    if args.dry_run:
        print(md_table(["#", "at (s after engines ready)", "fault", "decode rank out"],
                       [[f["i"], f"{f['at_s']:.0f}", describe(f), "yes" if f["decode_out"] else ""] for f in schedule],
                       "rrll"))
        return 0
    if args.reference_only:
        n = len(colocated_reference(ref_path(args), args.rows, args.shards, args.max_new_tokens))
        print(f"colocated reference: {n} rows in {ref_path(args)}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        result = soak(args, schedule)
    except KeyboardInterrupt:
        log(f"stopped; what it saw is in {Path(args.out) / 'soak.json'} and {Path(args.out) / 'table.md'}")
        return 130
    print(f"command: {result['command']}\n")
    print(table(result))
    print(f"\nhand-off tries per row (request metrics): {result['tries']}; the machine at its busiest: "
          f"{result['machine']}")
    print(result["verdict"])
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
