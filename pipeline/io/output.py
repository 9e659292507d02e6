"""The output shard: one row per input row, in input order.

Columns (documented in docs/outputs.md):
  id                 the input's id column (a nested id as its JSON text), or
                     "<shard name>:<row index>" when it has none
  <passthrough>      every input column except the id and text columns, unchanged
  generation         string, null on error
  generation_token_ids  list<int32>, the output token ids
  finish_reason      "stop" | "length" | null on error
  stop_reason        the stop string (or stop token id, as text) that ended the row; null when
                     EOS or the length limit did
  logprobs           job.sampling.logprobs=k: per generated token, its top-k candidates
                     [{token_id, logprob}], most likely first (vLLM adds the chosen token when it
                     is not among them); null otherwise
  cumulative_logprob the generated tokens' summed log-probability (with logprobs); else null
  prompt_tokens      int32, tokens in the rendered prompt (null when it could not be rendered)
  prompt_truncated   bool, the text was cut to fit the context (job.too_long=truncate)
  output_tokens      int32
  error              string, null when the row is fine; otherwise why it failed
  queue_s            seconds from the shard being read to the row entering prefill
  prefill_s          seconds of prefill (to the prefill worker's first token / KV ready)
  kv_handoff_s       seconds from prefill finished to the decode worker's first token
                     (hand-off message + NIXL transfer + scheduling); null when colocated
  ttft_s             seconds from entering prefill to the first output token
  decode_s           seconds from the first to the last output token
  kv_tokens          prompt tokens whose KV the decode worker received instead of computing
  kv_bytes           kv_tokens x KV bytes per token of the model
  prefill_worker     worker id ("prefill-0@host", "colocated-0@host")
  decode_worker      worker id ("decode-0@host"); null when colocated
  passage_ids        RAG jobs only: list<string>, the retrieved passages ("<doc id>#<chunk>"),
                     best first, numbered [1], [2], ... in the prompt
  passage_scores     RAG jobs only: list<float32>, their cosine similarity to the question

With job.sampling.n > 1 (several samples per prompt) the per-sample columns (SAMPLE_COLUMNS:
generation, generation_token_ids, finish_reason, stop_reason, logprobs, cumulative_logprob) hold
a list with one entry per sample, sample 0 first, in every row of the run; output_tokens counts
the tokens of all samples; the latency columns are sample 0's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import pyarrow as pa


@dataclass
class RowResult:
    """Everything the output shard records about one row beyond its input columns."""

    generation: str | None = None
    generation_token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None
    logprobs: list[list[tuple[int, float]]] | None = None
    cumulative_logprob: float | None = None
    prompt_tokens: int | None = None
    prompt_truncated: bool = False
    output_tokens: int = 0
    error: str | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    kv_handoff_s: float | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    kv_tokens: int = 0
    kv_bytes: int = 0
    prefill_worker: str | None = None
    decode_worker: str | None = None
    passage_ids: list[str] | None = None
    passage_scores: list[float] | None = None
    # -- Not output columns: what the row's request metrics record besides the columns above
    # (pipeline.io.metrics.request_record; times are time.time() seconds).
    prefill_start: float | None = None  # the row entered prefill
    prefill_end: float | None = None  # prefill finished, KV ready for hand-off (null colocated)
    decode_arrived_at: float | None = None  # the hand-off reached the decode worker
    token_times: list[float] | None = None  # when each output token reached its worker
    prefix_cached_tokens: int | None = None  # prompt tokens the (prefill) engine's prefix cache held
    tries: int = 1  # prefills (and hand-offs) the row took
    capacity_wait_s: float | None = None  # offload=dram: seconds waiting for DRAM-tier slots
    served: bool = True  # False: the row never reached an engine (a bad row), no request metrics


def served_row(*, text: str | None, token_ids: list[int], finish_reason: str | None, error: str | None,
               token_times: list[float], prefill_start: float, prefill_end: float | None,
               prefill_worker: str, logprobs: list[list[tuple[int, float]]] | None = None,
               stop_reason: str | None = None, cumulative_logprob: float | None = None,
               others: list = (), samples: bool = False, **rest) -> RowResult:
    """The :class:`RowResult` of a row an engine served, its latency columns derived from the
    times (seconds): prefill ``prefill_end - prefill_start`` (colocated, with no ``prefill_end``:
    up to the first token), KV hand-off ``first token - prefill_end`` (null colocated), TTFT
    ``first token - prefill_start``, decode ``last token - first token``; all but prefill null
    when no token came. ``logprobs``: per token, (token id, logprob) pairs (the engine's
    :class:`~pipeline.engine.stream.Streamed` form). The sample fields given are sample 0's;
    ``others``: samples 1..n-1 (objects with the same fields: ``Streamed`` or a wire ``Sample``);
    ``samples``: the run's sample columns are lists (``job.sampling.n`` > 1). ``rest``: the
    other :class:`RowResult` fields (``decode_worker``, ``kv_tokens`` ...)."""
    first = token_times[0] if token_times else None
    if prefill_end is not None:
        prefill_s = prefill_end - prefill_start
    else:
        prefill_s = (first - prefill_start) if first else None
    each = [dict(generation=text, generation_token_ids=token_ids, finish_reason=finish_reason,
                 stop_reason=stop_reason, cumulative_logprob=cumulative_logprob, logprobs=logprobs)]
    each += [dict(generation=o.text, generation_token_ids=o.token_ids, finish_reason=o.finish_reason,
                  stop_reason=o.stop_reason, cumulative_logprob=o.cumulative_logprob, logprobs=o.logprobs)
             for o in others]
    for e in each:
        e["logprobs"] = None if e["logprobs"] is None else [
            [{"token_id": t, "logprob": lp} for t, lp in step] for step in e["logprobs"]]
    if error:
        columns = dict.fromkeys(SAMPLE_COLUMNS)
    elif samples:
        columns = {k: [e[k] for e in each] for k in SAMPLE_COLUMNS}
    else:
        columns = each[0]
    return RowResult(
        **columns, output_tokens=sum(len(e["generation_token_ids"]) for e in each), error=error,
        prefill_s=prefill_s,
        kv_handoff_s=(first - prefill_end) if first and prefill_end is not None else None,
        ttft_s=(first - prefill_start) if first else None,
        decode_s=(token_times[-1] - first) if first else None,
        prefill_worker=prefill_worker, prefill_start=prefill_start, prefill_end=prefill_end,
        token_times=token_times, **rest)


RESULT_SCHEMA = pa.schema([
    ("generation", pa.string()),
    ("generation_token_ids", pa.list_(pa.int32())),
    ("finish_reason", pa.string()),
    ("stop_reason", pa.string()),
    ("logprobs", pa.list_(pa.list_(pa.struct([("token_id", pa.int32()), ("logprob", pa.float32())])))),
    ("cumulative_logprob", pa.float64()),
    ("prompt_tokens", pa.int32()),
    ("prompt_truncated", pa.bool_()),
    ("output_tokens", pa.int32()),
    ("error", pa.string()),
    ("queue_s", pa.float64()),
    ("prefill_s", pa.float64()),
    ("kv_handoff_s", pa.float64()),
    ("ttft_s", pa.float64()),
    ("decode_s", pa.float64()),
    ("kv_tokens", pa.int64()),
    ("kv_bytes", pa.int64()),
    ("prefill_worker", pa.string()),
    ("decode_worker", pa.string()),
    ("passage_ids", pa.list_(pa.string())),
    ("passage_scores", pa.list_(pa.float32())),
])
RAG_COLUMNS = ("passage_ids", "passage_scores")
SAMPLE_COLUMNS = ("generation", "generation_token_ids", "finish_reason", "stop_reason", "logprobs", "cumulative_logprob")
assert [f.name for f in fields(RowResult)][:len(RESULT_SCHEMA)] == RESULT_SCHEMA.names


def result_schema(samples: bool = False) -> pa.Schema:
    """The result columns: :data:`RESULT_SCHEMA`, or with ``samples`` (``job.sampling.n`` > 1)
    each of :data:`SAMPLE_COLUMNS` as a list of its type, one entry per sample."""
    if not samples:
        return RESULT_SCHEMA
    return pa.schema([pa.field(f.name, pa.list_(f.type)) if f.name in SAMPLE_COLUMNS else f for f in RESULT_SCHEMA])


def ids_as_keys(ids: pa.Array) -> pa.Array:
    """Ids usable as keys: those of a nested type (list, struct, map) become their JSON text
    (keys sorted); others are returned as they are."""
    if not pa.types.is_nested(ids.type):
        return ids
    return pa.array([None if v is None else json.dumps(v, sort_keys=True, default=str)
                     for v in ids.to_pylist()], pa.string())


def id_type(input_schema: pa.Schema, id_column: str) -> pa.DataType:
    """The output id column's type: the input's, string for a nested one (:func:`ids_as_keys`)
    or when the input has no id column."""
    if id_column not in input_schema.names:
        return pa.string()
    t = input_schema.field(id_column).type
    return pa.string() if pa.types.is_nested(t) else t


def row_ids(batch: pa.Table | pa.RecordBatch, id_column: str, shard_name: str, first_row: int = 0) -> pa.Array:
    """The id column of ``batch`` (rows ``first_row``... of its shard; nested ids as their JSON
    text, :func:`ids_as_keys`), or ``"<shard name>:<row index>"`` strings when the input has none."""
    if id_column in batch.schema.names:
        column = batch.column(id_column)
        return ids_as_keys(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
    return pa.array([f"{shard_name}:{first_row + i}" for i in range(batch.num_rows)], pa.string())


def passthrough_names(input_names: list[str], id_column: str, text_column: str,
                      prefix: str | None) -> dict[str, str]:
    """Input column -> its output name, for every input column but the id and text columns. A
    column named like an output column is kept as ``prefix + name`` (``job.input_column_prefix``).

    Raises:
        ValueError: such a clash and no ``prefix`` (names the columns and the setting).
    """
    taken = set(RESULT_SCHEMA.names) | {id_column}
    names = [n for n in input_names if n not in (id_column, text_column)]
    clash = [n for n in names if n in taken]
    if clash and not prefix:
        raise ValueError(f"input column name clashes with an output column: {', '.join(clash)}; set "
                         f"job.input_column_prefix (for example input_) to keep them under that prefix")
    return {n: (prefix + n if n in taken else n) for n in names}


def output_schema(input_schema: pa.Schema, id_column: str, text_column: str, rag: bool = False,
                  prefix: str | None = None, samples: bool = False) -> pa.Schema:
    """The output shard's schema for an input shard of ``input_schema`` (see :func:`build_output`;
    ``samples``: :func:`result_schema`).

    Raises:
        ValueError: an input column clashes with an output column and no ``prefix`` is set.
    """
    fields = [pa.field(id_column, id_type(input_schema, id_column))]
    for name, out in passthrough_names(input_schema.names, id_column, text_column, prefix).items():
        fields.append(input_schema.field(name).with_name(out))
    fields += [f for f in result_schema(samples) if rag or f.name not in RAG_COLUMNS]
    return pa.schema(fields)


def build_output(table: pa.Table | pa.RecordBatch, ids: pa.Array, id_column: str, text_column: str,
                 results: list[RowResult], rag: bool = False, prefix: str | None = None,
                 samples: bool = False) -> pa.Table:
    """Assemble rows of the output shard: ``id_column``, passthrough columns (renamed with
    ``prefix`` where they clash with an output column), then the result columns (the RAG columns
    only when ``rag``; ``samples``: :func:`result_schema`).

    Raises:
        ValueError: ``results`` does not hold exactly one entry per input row, or an input
            column has the name of a result column and no ``prefix`` is set.
    """
    if len(results) != table.num_rows:
        raise ValueError(f"{len(results)} results for {table.num_rows} input rows")
    columns = {id_column: ids}
    for name, out in passthrough_names(table.schema.names, id_column, text_column, prefix).items():
        columns[out] = table.column(name)
    for field in result_schema(samples):
        if field.name in RAG_COLUMNS and not rag:
            continue
        columns[field.name] = pa.array([getattr(r, field.name) for r in results], field.type)
    return pa.table(columns)
