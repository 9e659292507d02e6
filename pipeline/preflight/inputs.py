"""Preflight: the templates, and the input's schema from the Parquet footers (no row data), or
from the head of a JSON Lines or CSV shard (they have no footer)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import Config, ConfigError
from pipeline.io.atomic import url_to_fs
from pipeline.io.formats import LINE_ERROR
from pipeline.io.openai_batch import is_request_batch
from pipeline.io.output import RESULT_SCHEMA, passthrough_names
from pipeline.io.prompts import parse_template
from pipeline.io.shards import Shard, output_clashes, shard_format, shard_rows, shard_schema
from pipeline.preflight.locations import one_line
from pipeline.rag.retrieve import DEFAULT_TEMPLATE, TEMPLATE_SLOTS

FOOTER_THREADS = 16  # footers read at a time (object stores answer each in a round trip)


def check_templates(cfg: Config) -> None:
    """``job.prompt_template`` (``{text}``, at least once), ``job.system_prompt`` (no
    placeholder) and ``job.rag.template`` (``{passages}`` and ``{question}``) parse as format
    strings with only their own placeholders.

    Raises:
        ConfigError: the first bad template, naming its setting (see
            :func:`pipeline.io.prompts.parse_template`).
    """
    job = cfg.job
    checks = [(job.prompt_template, "job.prompt_template", ("text",)), (job.system_prompt, "job.system_prompt", ())]
    if job.rag:
        checks.append((job.rag.template or DEFAULT_TEMPLATE, "job.rag.template", TEMPLATE_SLOTS))
    for template, key, slots in checks:
        if template is None:
            continue
        try:
            parse_template(template, key, slots, slots)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _footer(shard: Shard) -> tuple[pa.Schema | None, int | None, str | None]:
    """(schema, rows, None) from the shard's footer (Parquet), or from its head and one pass
    counting its rows (JSON Lines, CSV: no footer; :func:`pipeline.io.shards.shard_rows`), or
    (None, None, why it does not parse)."""
    fs, path = url_to_fs(shard.url)
    try:
        f = fs.open(path, "rb")
    except Exception as exc:  # noqa: BLE001 -- permission, vanished file ...: one line
        raise ConfigError(f"job.input: cannot read {shard.url}: {one_line(exc)}") from None
    with f:
        try:
            if shard_format(shard) != "parquet":
                return shard_schema(shard), shard_rows(shard), None
            meta = pq.ParquetFile(f)
            return meta.schema_arrow, meta.metadata.num_rows, None
        except (OSError, ValueError, pa.ArrowException) as exc:
            return None, None, one_line(exc)


def read_footers(shards: list[Shard]) -> tuple[list[pa.Schema | None], list[int | None], dict[str, str]]:
    """Each shard's schema and row count (:func:`_footer`; up to :data:`FOOTER_THREADS` read
    at a time), and why for the shards whose footer does not parse (``None`` schema and rows):
    those are left to fail on their own when their owner reads them, and the others run.

    Raises:
        ConfigError: ``job.input``: a shard cannot be opened (permission, vanished ...), two
            shards would write the same output shard (``a/b.jsonl`` and ``a/b.parquet``), or no
            shard parses (a text file named ``docs.parquet``): there are no others to run.
    """
    if clashes := output_clashes(shards):
        first, other, name = clashes[0]
        raise ConfigError(f"job.input: shards {first} and {other} would both write the output shard {name}; "
                          f"rename or move one")
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        found = list(pool.map(_footer, shards))
    unreadable = {s.name: why for s, (_, _, why) in zip(shards, found) if why is not None}
    if shards and len(unreadable) == len(shards):
        name, why = next(iter(unreadable.items()))
        which = "its only shard" if len(shards) == 1 else f"{len(shards)} shards; the first"
        raise ConfigError(f"job.input: no shard is readable, so nothing would run ({which}, {name}: {why})")
    return [f[0] for f in found], [f[1] for f in found], unreadable


def _text_type(t: pa.DataType) -> bool:
    """String or binary (of any width or view), dictionary-encoded or not; or all null."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    kinds = ("is_string", "is_large_string", "is_binary", "is_large_binary", "is_string_view",
             "is_binary_view", "is_null")
    return any(getattr(pa.types, k, lambda _: False)(t) for k in kinds)


def _messages_type(t: pa.DataType) -> bool:
    """A list of structs with ``role`` and ``content`` fields (OpenAI chat messages), text (each
    value the JSON text of such a list: CSV, JSON-encoded Parquet), or all null."""
    if _text_type(t):
        return True
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    value = t.value_type
    return pa.types.is_struct(value) and {"role", "content"} <= {value.field(i).name for i in range(value.num_fields)}


def check_columns(cfg: Config, schemas: list[pa.Schema | None], names: list[str] | None = None) -> dict[str, str]:
    """Check the input schemas (one per shard, named by ``names``; ``None``: unreadable,
    skipped) against the job: the text column is in each with a text type, the id column is not
    an output column's name, and no passed-through input column collides with an output column
    (the names the output writer gives them, :func:`pipeline.io.output.passthrough_names`).
    Returns the renaming ``job.input_column_prefix`` gives (old name -> new name).

    Raises:
        ConfigError: the text column missing or not text (``job.text_column``), or the
            messages column missing or not chat messages (``job.messages_column``); clashing
            columns with ``job.input_column_prefix`` null (naming them and the setting), or
            prefixed names that clash too.
    """
    job = cfg.job
    names = names or [f"shard {i}" for i in range(len(schemas))]
    taken = set(RESULT_SCHEMA.names) | {job.id_column}
    if job.id_column in RESULT_SCHEMA.names:
        raise ConfigError(f"job.id_column: {job.id_column!r} is the name of an output column; choose another")
    readable = [(name, schema) for name, schema in zip(names, schemas) if schema is not None]
    clash: list[str] = []
    column = job.prompt_column
    key = "job.messages_column" if job.messages_column else "job.text_column"
    for name, schema in readable:
        if is_request_batch(schema):  # an OpenAI batch file: its requests say what the prompt is
            continue
        if schema.names == [LINE_ERROR]:  # JSON Lines / CSV with no row in its head (empty, or no
            continue                      # object lines): its rows, if any, are error rows that say why
        if column not in schema.names:
            raise ConfigError(f"{key}: column {column!r} is not in shard {name} "
                              f"(columns: {', '.join(schema.names)})")
        t = schema.field(column).type
        if job.messages_column and not _messages_type(t):
            raise ConfigError(f"{key}: column {column!r} of shard {name} is {t}, not a list of "
                              f"{{role, content}} structs nor their JSON text")
        if not job.messages_column and not _text_type(t):
            raise ConfigError(f"{key}: column {column!r} of shard {name} is {t}, "
                              f"not text (string or binary)")
        kept = passthrough_names(schema.names, job.id_column, column, "input_")
        clash += [c for c, out in kept.items() if out != c and c not in clash]
    prefix = job.input_column_prefix
    if clash and not prefix:
        example = ", ".join(f"input_{c}" for c in clash)
        raise ConfigError(f"job.input: input columns {', '.join(clash)} clash with output columns; set "
                          f"job.input_column_prefix=input_ to keep them as {example}")
    for name, schema in readable:
        outs = list(passthrough_names(schema.names, job.id_column, column, prefix).values())
        bad = sorted({o for o in outs if o in taken or outs.count(o) > 1})
        if bad:
            raise ConfigError(f"job.input_column_prefix: {prefix!r} gives {', '.join(bad)}, which clash with "
                              f"columns of shard {name} or the output too; choose another prefix")
    return {c: prefix + c for c in clash}


def asks_for_samples(url: str) -> bool:
    """Whether a request of the OpenAI batch file at ``url`` asks for more than one sample
    (``body.n`` > 1), read through once (lines without ``"n"`` are not parsed)."""
    fs, path = url_to_fs(url)
    with fs.open(path, "rb") as f:
        for line in f:
            if b'"n"' not in line:
                continue
            try:
                body = json.loads(line).get("body")
            except (ValueError, AttributeError):
                continue
            n = body.get("n") if isinstance(body, dict) else None
            if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 1:
                return True
    return False
