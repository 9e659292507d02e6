"""Per-request and per-worker metrics, written as Parquet in the run directory next to the output.

``RUN_DIR/metrics/requests/<shard name>/part-<n>.parquet`` (the shard name is its relative path): one row per served row (rows that
became error rows before prefill, such as empty text, have no metrics). Written by the shard's
owner each time it checkpoints a batch of finished rows, so a resumed run keeps the metrics of
rows finished before the interruption. When the shard is done its parts are merged into one,
``part-merged-<n>.parquet`` (:func:`compact_request_metrics`), so that a run directory holds a
metrics file per shard, not one per ``job.checkpoint_rows`` rows; the merged file names the parts
it replaces, and readers skip those until they are removed. All times are wall-clock seconds since the epoch
(``time.time()``), so rows from different workers on one node line up; across nodes they are as
good as the nodes' clock synchronisation (NTP: ~1 ms).

==================  =============  ======================================================
column              type           meaning
==================  =============  ======================================================
key                 string         ``"<shard index>:<row index>"``
shard               string         input shard file name
row                 int64          row index in the shard
prefill_worker      string         worker id of the prefill (or colocated) worker
decode_worker       string         worker id of the decode worker; null when colocated
read_at             float64        the shard was read (the row became ready to serve)
prefill_start       float64        the row entered prefill (queue wait = this - read_at)
prefill_end         float64        prefill finished: KV ready for hand-off (null colocated)
decode_arrived_at   float64        the hand-off reached the decode worker (null colocated)
token_times         list<float64>  when each output token was seen, one per token
prompt_tokens       int32          tokens in the prompt
output_tokens       int32          tokens generated
kv_tokens           int64          prompt tokens whose KV decode received over NIXL
kv_bytes            int64          kv_tokens x KV bytes per token
prefix_cached_tokens int64         prompt tokens the prefill engine found in its prefix cache
tries               int32          times the row was prefilled (> 1 after a lost hand-off)
error               string         null unless the row failed while being served
capacity_wait_s     float64        seconds the prefill worker waited for DRAM-tier slots before the
                                   prefill (``offload=dram``; null otherwise)
==================  =============  ======================================================

Derived (see :func:`request_summary`): TTFT = ``token_times[0] - prefill_start``; ITL = the
differences of consecutive ``token_times``; KV hand-off = ``token_times[0] - prefill_end``.

``RUN_DIR/metrics/workers/<worker id>.<pid>.<part>.parquet``: one row per engine step of one
worker, written by a vLLM stat logger (:class:`StepRecorder`): a new part holds the steps since the
previous one, written every ``FLUSH_EVERY_S`` seconds while the worker runs and when it stops.
Every ``MERGE_PARTS`` parts are merged into one ``<worker id>.<pid>.<first>-<last>.parquet``
(and every ``MERGE_PARTS`` of those, and so on), so a worker has at most about
``MERGE_PARTS`` files a level however long it runs; a reader takes a merged file in place of the
parts it covers (:func:`worker_metrics_files`).

==================  =========  ============================================================
column              type       meaning
==================  =========  ============================================================
worker              string     worker id ("prefill-0@host", "decode-1@host", "colocated-0@host")
role                string     "prefill" | "decode" | "colocated"
t                   float64    when the step's outputs were processed (epoch seconds)
running             int32      requests in the running batch (the batch size of the step)
waiting             int32      requests waiting (including those waiting for remote KV)
kv_cache_usage      float64    fraction of the KV cache's blocks in use, 0..1
prompt_tokens       int32      prompt tokens computed in the step
generation_tokens   int32      output tokens produced in the step
prefix_cache_queries int64     prompt tokens looked up in the local prefix cache in the step
prefix_cache_hits   int64      of those, tokens found (their KV neither computed nor received)
kv_post_s           list       per KV transfer this worker initiated that completed in the step:
kv_transfer_s       list         seconds posting it, seconds from post to completion,
kv_transfer_bytes   list         bytes moved,
kv_transfer_descriptors list     NIXL descriptors it took (NIXL's telemetry)
kv_held_s           list       offload=dram: seconds from prefill end to its KV write completing
kv_freed_s          list       offload=dram: seconds from prefill end to vLLM freeing its blocks
kv_load_tokens      list       offload=dram, decode: per load from the DRAM tier, tokens loaded,
kv_load_recompute_tokens list    tokens computed after it,
kv_load_after_preemption list    1 if the request came back after a preemption
prompt_tokens_computed int32   prompt tokens computed in the step (not cached, not received)
preempted           int32      requests preempted in the step
==================  =========  ============================================================

The ``kv_*`` lists hold one entry per TP rank that did the work: between pools of different TP
sizes each rank of the larger pool moves its own KV heads (3 transfers of a third of the bytes
each between TP 3 and TP 1), and with the DRAM tier each rank of an engine of TP n records its own
write or load (n entries per request, each of all its tokens, a 1/n share of the bytes).

vLLM's prefix-cache hit rate of a worker = sum(prefix_cache_hits) / sum(prefix_cache_queries).

``RUN_DIR/metrics/dram/<worker id>.<pid>.json`` (``offload=dram``, one per decode worker process,
written when it stops): its DRAM tier's ``num_slots``, ``slot_bytes`` (one KV block of every
layer), ``block_tokens``, ``peak_slots`` and ``use``, ``[epoch seconds, slots in use]`` after
every reservation and release (:func:`read_dram_use`). A slot is reserved before the row's
prefill and released when its decode ends.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.atomic import atomic_write, read_json, write_json, write_parquet
from pipeline.io.shards import run_files, shard_path

if TYPE_CHECKING:
    from pipeline.io.output import RowResult

T = TypeVar("T")

REQUEST_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("shard", pa.string()),
    ("row", pa.int64()),
    ("prefill_worker", pa.string()),
    ("decode_worker", pa.string()),
    ("read_at", pa.float64()),
    ("prefill_start", pa.float64()),
    ("prefill_end", pa.float64()),
    ("decode_arrived_at", pa.float64()),
    ("token_times", pa.list_(pa.float64())),
    ("prompt_tokens", pa.int32()),
    ("output_tokens", pa.int32()),
    ("kv_tokens", pa.int64()),
    ("kv_bytes", pa.int64()),
    ("prefix_cached_tokens", pa.int64()),
    ("tries", pa.int32()),
    ("error", pa.string()),
    ("capacity_wait_s", pa.float64()),
])

WORKER_SCHEMA = pa.schema([
    ("worker", pa.string()),
    ("role", pa.string()),
    ("t", pa.float64()),
    ("running", pa.int32()),
    ("waiting", pa.int32()),
    ("kv_cache_usage", pa.float64()),
    ("prompt_tokens", pa.int32()),
    ("generation_tokens", pa.int32()),
    ("prefix_cache_queries", pa.int64()),
    ("prefix_cache_hits", pa.int64()),
    # NIXL telemetry of the KV transfers this worker initiated that completed in this step (the
    # prefill worker in push mode, the decode worker in pull mode), one entry per transfer:
    # post = seconds spent posting it, transfer = seconds from post to completion, bytes moved.
    ("kv_post_s", pa.list_(pa.float64())),
    ("kv_transfer_s", pa.list_(pa.float64())),
    ("kv_transfer_bytes", pa.list_(pa.int64())),
    ("kv_transfer_descriptors", pa.list_(pa.int64())),
    # offload=dram, prefill worker: per completed write, seconds from the prefill request
    # finishing to its KV blocks being released to vLLM (waiting to post + transfer).
    ("kv_held_s", pa.list_(pa.float64())),
    # offload=dram, prefill worker: per request whose blocks vLLM freed (at the end of the step
    # in which the write completed), seconds from the prefill request finishing to that.
    ("kv_freed_s", pa.list_(pa.float64())),
    # offload=dram, decode worker: per load from the DRAM tier in the step, the tokens it brought,
    # the tokens the engine then computed itself (the last prompt token, plus the generated ones
    # after a preemption), and 1 if the request came back after a preemption.
    ("kv_load_tokens", pa.list_(pa.int64())),
    ("kv_load_recompute_tokens", pa.list_(pa.int64())),
    ("kv_load_after_preemption", pa.list_(pa.int32())),
    # prompt tokens the engine computed itself in the step (vLLM's PromptTokenStats.computed:
    # neither prefix-cached nor received), and requests it preempted in the step.
    ("prompt_tokens_computed", pa.int32()),
    ("preempted", pa.int32()),
])

def request_record(result: "RowResult", *, key: str, shard: str, row: int, read_at: float) -> dict[str, Any]:
    """The :data:`REQUEST_SCHEMA` record of one served row: the one place a row's request
    metrics are assembled, for every role."""
    return {
        "key": key, "shard": shard, "row": row, "read_at": read_at,
        "prefill_worker": result.prefill_worker, "decode_worker": result.decode_worker,
        "prefill_start": result.prefill_start, "prefill_end": result.prefill_end,
        "decode_arrived_at": result.decode_arrived_at, "token_times": result.token_times,
        "prompt_tokens": result.prompt_tokens, "output_tokens": result.output_tokens,
        "kv_tokens": result.kv_tokens, "kv_bytes": result.kv_bytes,
        "prefix_cached_tokens": result.prefix_cached_tokens, "tries": result.tries,
        "error": result.error, "capacity_wait_s": result.capacity_wait_s,
    }


def write_request_metrics(run_path: Path, shard: str, records: list[dict[str, Any]]) -> None:
    """Append ``records`` (dicts with the :data:`REQUEST_SCHEMA` columns) as one new part file
    of ``shard``'s request metrics. Written under a temporary name and renamed."""
    if not records:
        return
    table = pa.Table.from_pylist(records, schema=REQUEST_SCHEMA)
    write_parquet(table, shard_path(Path(run_path) / "metrics" / "requests", shard) / f"part-{uuid.uuid4().hex}.parquet")


MERGED_PREFIX = "part-merged-"
"""Name prefix of a shard's merged request metrics file (:func:`compact_request_metrics`)."""

REPLACES_KEY = b"pd_pipeline.replaces"
"""Key of a merged file's Parquet metadata: the JSON list of the part names it replaces."""

MERGE_ROWS = 65536  # rows per row group of a merged file (and at most in memory while merging)


def request_metrics_files(run_path: Path) -> list[Path]:
    """The request metrics files of a run to read, sorted: every part, less those a merged file
    beside it replaces (its merge ended, its parts not yet all removed)."""
    parts = run_files(Path(run_path) / "metrics" / "requests", "part-*.parquet", recursive=True)
    replaced: set[Path] = set()
    for p in parts:
        if p.name.startswith(MERGED_PREFIX):
            replaced.update(p.parent / name for name in _replaces(p))
    return [p for p in parts if p not in replaced]


def _replaces(path: Path) -> list[str]:
    """The part names merged file ``path`` replaces (from its footer)."""
    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta.get(REPLACES_KEY, b"[]"))


def read_request_metrics(run_path: Path, columns: list[str] | None = None) -> pa.Table:
    """Every request metrics row of a run (an empty table with the schema when there is none);
    ``columns``: only these (None: all)."""
    schema = REQUEST_SCHEMA if columns is None else pa.schema([REQUEST_SCHEMA.field(c) for c in columns])

    def read() -> pa.Table:
        parts = request_metrics_files(run_path)
        if not parts:
            return schema.empty_table()
        return pa.concat_tables([pq.read_table(p, schema=REQUEST_SCHEMA, columns=columns).cast(schema)
                                 for p in parts])

    return while_merging(read)


def while_merging(read: Callable[[], T], tries: int = 3) -> T:
    """``read()``, listed and read again when a part it listed was removed before it was read
    (a worker's merge, :func:`compact_request_metrics`, ended in between: the merged file holds
    its rows)."""
    for attempt in range(tries):
        try:
            return read()
        except FileNotFoundError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def compact_request_metrics(run_path: Path, shard: str) -> int:
    """Merge ``shard``'s request metrics parts (one per checkpoint batch) into one file,
    ``part-merged-<n>.parquet``, in the order a reader reads them, and remove the parts; returns
    the number of parts merged (0: one part or none, nothing to do). Call it once every row of
    the shard has its metrics (the shard is done). The merged file names the parts it replaces
    and :func:`request_metrics_files` skips them, so a reader never counts a row twice, whenever
    this is stopped. Memory: at most :data:`MERGE_ROWS` rows at a time."""
    folder = shard_path(Path(run_path) / "metrics" / "requests", shard)
    present = run_files(folder, "part-*.parquet")
    replaced = {name for p in present if p.name.startswith(MERGED_PREFIX) for name in _replaces(p)}
    live = [p for p in present if p.name not in replaced]
    if len(live) <= 1:
        return 0
    schema = REQUEST_SCHEMA.with_metadata({REPLACES_KEY: json.dumps([p.name for p in present]).encode()})
    with atomic_write(folder / f"{MERGED_PREFIX}{uuid.uuid4().hex}.parquet") as f:
        writer = pq.ParquetWriter(f, schema)
        try:
            buf: list[pa.Table] = []
            rows = 0
            for p in live:
                t = pq.read_table(p, schema=REQUEST_SCHEMA)
                buf.append(t)
                rows += t.num_rows
                if rows >= MERGE_ROWS:
                    writer.write_table(pa.concat_tables(buf).cast(schema))
                    buf, rows = [], 0
            if buf:
                writer.write_table(pa.concat_tables(buf).cast(schema))
        finally:
            writer.close()
    for p in present:
        p.unlink(missing_ok=True)
    return len(live)


# "<stem>.<first>.parquet" or "<stem>.<first>-<last>.parquet" (a merged file): the part numbers held.
_PART = re.compile(r"^(?P<stem>.+)\.(?P<first>\d{5,})(?:-(?P<last>\d{5,}))?\.parquet$")


def worker_part_path(directory: Path, stem: str, first: int, last: int) -> Path:
    """The worker-metrics file ``<stem>.<first>.parquet`` (one part, ``first == last``) or
    ``<stem>.<first>-<last>.parquet`` (parts first..last merged) in ``directory``."""
    span = f"{first:05d}" if first == last else f"{first:05d}-{last:05d}"
    return directory / f"{stem}.{span}.parquet"


def worker_part_range(path: Path) -> tuple[str, int, int] | None:
    """``(stem, first, last)``: the parts a worker-metrics file holds (a part: first == last);
    None for a name of another form."""
    m = _PART.match(path.name)
    if m is None:
        return None
    first = int(m["first"])
    return m["stem"], first, int(m["last"]) if m["last"] else first


def worker_metrics_files(run_path: Path) -> list[Path]:
    """The worker-metrics files of a run to read: each part once, a merged file in place of the
    parts it covers (a listing taken while a worker merges may hold both)."""
    files = run_files(Path(run_path) / "metrics" / "workers", "*.parquet")
    ranges = {f: worker_part_range(f) for f in files}
    spans: dict[str, list[tuple[int, int]]] = {}
    for r in ranges.values():
        if r is not None:
            spans.setdefault(r[0], []).append((r[1], r[2]))

    def covered(r: tuple[str, int, int] | None) -> bool:
        return r is not None and any(a <= r[1] and r[2] <= b and (a, b) != (r[1], r[2]) for a, b in spans[r[0]])

    return [f for f in files if not covered(ranges[f])]


def read_worker_metrics(run_path: Path, columns: list[str] | None = None,
                        dictionary: tuple[str, ...] = ()) -> pa.Table:
    """Every worker step row of a run (an empty table with the schema when there is none);
    ``columns``: only these (None: all); ``dictionary``: these string columns read
    dictionary-encoded (a worker's name once per file, not once per step). A part merged away
    while it is read (:data:`pipeline.engine.steps.MERGE_PARTS`) makes it list the files again,
    up to 5 times."""
    names = pa.dictionary(pa.int32(), pa.string())
    full = pa.schema([f.with_type(names) if f.name in dictionary else f for f in WORKER_SCHEMA])
    schema = full if columns is None else pa.schema([full.field(c) for c in columns])

    def read() -> pa.Table:
        parts = worker_metrics_files(run_path)
        if not parts:
            return schema.empty_table()
        return concat_files(lambda p: pq.read_table(p, schema=full, columns=columns).cast(schema), parts)

    for _ in range(4):
        try:
            return read()
        except FileNotFoundError:
            continue
    return read()


CONCAT_FILES = 64
"""Files whose rows :func:`concat_files` puts in one chunk."""


def concat_files(read: Callable[[Path], pa.Table], paths: list[Path]) -> pa.Table:
    """``read(path)`` of every path, concatenated, :data:`CONCAT_FILES` files' rows a chunk (a
    buffer per column each): not a few small buffers per file, whose memory thousands of files
    (a run's worker steps, a part per 30 s) leave scattered (issue #39)."""
    return pa.concat_tables([pa.concat_tables([read(p) for p in paths[i:i + CONCAT_FILES]]).combine_chunks()
                             for i in range(0, len(paths), CONCAT_FILES)])


def write_dram_use(run_path: Path, worker: str, record: dict[str, Any]) -> None:
    """Write one decode worker's DRAM-tier use (:meth:`pipeline.engine.dram_pool.DramPool.use_record`
    plus ``block_tokens``) under ``RUN_DIR/metrics/dram/``."""
    write_json(Path(run_path) / "metrics" / "dram" / f"{worker}.{os.getpid()}.json", record)


def read_dram_use(run_path: Path) -> list[dict[str, Any]]:
    """Every decode worker's DRAM-tier use record of a run (see the module docstring), each with
    its ``worker``; empty without the tier."""
    out = []
    for p in run_files(Path(run_path) / "metrics" / "dram", "*.json"):
        out.append({"worker": p.name.rsplit(".", 2)[0], **read_json(p)})
    return out


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals (seconds): the time an engine
    was busy with at least one of them (overlaps counted once)."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
