"""JSON Lines and CSV shards: typed from the file's head, read in bounded batches of rows, a bad
line kept as an error row.

JSON and CSV have no footer, so a shard's schema comes from its first :data:`HEAD_ROWS` rows:
JSON Lines columns are the keys met there (in order of first appearance) with the type
``pyarrow`` infers from their values; CSV columns are the header's, typed by ``pyarrow.csv``
from those rows. A column null in every head row, or whose head values mix types, is a string
column (non-string values as their JSON text). Keys first met later are not read.

Every data line is one row. A line that cannot become a row (not valid JSON or UTF-8, not a JSON
object, a CSV row with another number of fields than the header, a value that does not fit its
column's type) is a row whose other columns are null and whose :data:`LINE_ERROR` column says
why, with its line number: the pipeline turns it into an error row. Blank lines are not rows.
Lines are parsed by Python (``json.loads``, ``csv``) because ``pyarrow.json`` and
``pyarrow.csv`` fail a whole block on one bad line.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import posixpath
import sys
from typing import IO, Any, Iterator

import pyarrow as pa
import pyarrow.csv as pacsv

HEAD_ROWS = 1024  # rows a JSON Lines or CSV shard's schema is inferred from
LINE_ERROR = "line_error"  # why a line could not be read (null when it was)
EXTENSIONS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
CONVERT_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # documents longer than csv's 128 KiB default


READ = "Parquet (.parquet), JSON Lines (.jsonl, .json, .ndjson) and CSV (.csv)"  # what EXTENSIONS reads, in words


def file_format(name: str) -> str | None:
    """``parquet``, ``jsonl`` or ``csv`` by the file's extension (any case), or None."""
    dot = name.rfind(".")
    return EXTENSIONS.get(name[dot:].lower()) if dot >= 0 else None


def unread_extension(name: str) -> str | None:
    """The extension of the file ``name`` (a path; its last component counts) when it has one
    that is not read (``.txt``, ``.tsv``), else None: a readable one, or none at all (a file
    without an extension is read as Parquet)."""
    ext = posixpath.splitext(posixpath.basename(name))[1]
    return ext if ext and ext.lower() not in EXTENSIONS else None


def chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    while chunk := list(itertools.islice(items, size)):
        yield chunk


# -- JSON Lines ---------------------------------------------------------------------------------


def not_utf8(line: int, raw: bytes, offset: int, where: str = "") -> str:
    """Why line ``line`` is not a row: the byte of ``raw`` at ``offset`` is not UTF-8."""
    return f"line {line} is not valid UTF-8 (byte 0x{raw[offset]:02x} at offset {offset}{where})"


def json_lines(f: IO[bytes]) -> Iterator[tuple[int, Any]]:
    """(line number from 1, the line's JSON value, or why it is not valid JSON as a string) for
    every line that is not blank. An object whose bytes are not all UTF-8 comes with
    :data:`LINE_ERROR` set (why) and its fields read with U+FFFD for the bad bytes, so its row
    keeps its id."""
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except UnicodeDecodeError as exc:
            why = not_utf8(n, exc.object, exc.start)
            try:  # keep the row's other fields (its id above all), the row an error
                value = json.loads(line.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                value = None
            yield n, {**value, LINE_ERROR: why} if isinstance(value, dict) else why
        except (ValueError, RecursionError) as exc:
            yield n, f"line {n} is not valid JSON: {exc}"


def json_kind(value: Any) -> str:
    """The JSON name of a Python value's type (``object``, ``array``, ``string`` ...)."""
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def json_layout(head: list[tuple[int, Any]]) -> tuple[pa.Schema, frozenset[str]]:
    """The schema of a JSON Lines shard from its head lines (:func:`json_lines`), and its
    *loose* columns: typed string because their head values were all null or of mixed types;
    they hold a non-string value as its JSON text."""
    objects = [v for _, v in head if isinstance(v, dict)]
    names = [n for n in dict.fromkeys(k for o in objects for k in o) if n != LINE_ERROR]
    fields, loose = [], set()
    for name in names:
        try:
            t = pa.array([o.get(name) for o in objects]).type
        except CONVERT_ERRORS:
            t = pa.null()
        if pa.types.is_null(t):
            t = pa.string()
            loose.add(name)
        fields.append(pa.field(name, t))
    return pa.schema(fields + [pa.field(LINE_ERROR, pa.string())]), frozenset(loose)


def _column(values: list[Any], field: pa.Field, lines: list[int], errors: list[str | None]) -> pa.Array:
    """``values`` as an array of ``field``'s type; a value that does not fit is null, and its
    row's error (``errors``, by position) says so unless it already has one."""
    try:
        return pa.array(values, field.type)
    except CONVERT_ERRORS:
        pass
    kept = []
    for i, value in enumerate(values):
        try:
            pa.array([value], field.type)
            kept.append(value)
        except CONVERT_ERRORS:
            kept.append(None)
            errors[i] = errors[i] or f"line {lines[i]}: {field.name} is a JSON {json_kind(value)}, not {field.type}"
    return pa.array(kept, field.type)


def json_batch(items: list[tuple[int, Any]], schema: pa.Schema, loose: frozenset[str] = frozenset()) -> pa.RecordBatch:
    """Rows of ``schema`` (:func:`json_layout`) from (line number, value) items; a line that is
    not a fitting JSON object is a row with only :data:`LINE_ERROR` set."""
    lines = [n for n, _ in items]
    errors: list[str | None] = [None] * len(items)
    rows: list[dict] = []
    for i, (n, value) in enumerate(items):
        if isinstance(value, str):  # json_lines' message for a line that does not parse
            errors[i], value = value, {}
        elif not isinstance(value, dict):
            errors[i], value = f"line {n} is a JSON {json_kind(value)}, not an object", {}
        else:
            errors[i] = value.get(LINE_ERROR)
        rows.append(value)
    arrays = []
    for field in schema:
        if field.name == LINE_ERROR:
            continue
        values = [r.get(field.name) for r in rows]
        if field.name in loose:
            values = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
        arrays.append(_column(values, field, lines, errors))
    arrays.append(pa.array(errors, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def json_batches(f: IO[bytes], rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """A JSON Lines shard's schema and its rows, ``rows`` at a time."""
    lines = json_lines(f)
    head = list(itertools.islice(lines, HEAD_ROWS))
    schema, loose = json_layout(head)
    return schema, (json_batch(c, schema, loose) for c in chunks(itertools.chain(head, lines), rows))


# -- CSV ----------------------------------------------------------------------------------------


def csv_records(f: IO[bytes]) -> tuple[list[str], Iterator[tuple[int, list[str] | str]]]:
    """A CSV file's header and its records: (line number, fields, or why the record is not a
    row). Bytes that are not UTF-8 make their record an error (when it is converted)."""
    # utf-8-sig: a byte-order mark (Excel's CSV export) is not part of the first column's name.
    reader = csv.reader(io.TextIOWrapper(f, "utf-8-sig", errors="surrogateescape", newline=""))
    try:
        header = next(reader, [])
    except csv.Error:
        header = []

    def records() -> Iterator[tuple[int, list[str] | str]]:
        while True:
            start = reader.line_num + 1
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield start, f"line {start} is not valid CSV: {exc}"
                continue
            if not fields:
                continue
            if len(fields) != len(header):
                yield start, f"line {start} has {len(fields)} fields; the header has {len(header)}"
            else:
                yield start, fields

    return header, records()


def _csv_parse(records: list[list[str]], names: list[str], types: dict[str, pa.DataType] | None) -> pa.Table:
    """``records`` read by ``pyarrow.csv`` (its type inference and null values), as typed by
    ``types`` when given."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(records)
    return pacsv.read_csv(io.BytesIO(text.getvalue().encode("utf-8")),
                          read_options=pacsv.ReadOptions(column_names=names),
                          parse_options=pacsv.ParseOptions(newlines_in_values=True),
                          convert_options=pacsv.ConvertOptions(column_types=types))


def csv_layout(header: list[str], head: list[tuple[int, list[str] | str]]) -> pa.Schema:
    """The schema of a CSV shard: the header's columns, typed by ``pyarrow.csv`` from the head
    records (all null there: string), and :data:`LINE_ERROR`."""
    good = [[_replaced(v) for v in r] for _, r in head if isinstance(r, list)]  # bad bytes as U+FFFD
    types = {name: pa.string() for name in header}
    if good and header:
        try:
            table = _csv_parse(good, header, None)
            types = {f.name: pa.string() if pa.types.is_null(f.type) else f.type for f in table.schema}
        except CONVERT_ERRORS:  # a header pyarrow refuses (duplicate names ...): every column as text
            pass
    return pa.schema([pa.field(n, types[n]) for n in header] + [pa.field(LINE_ERROR, pa.string())])


def _replaced(value: str) -> str:
    """A field read with ``surrogateescape``, its bytes that are not UTF-8 as U+FFFD."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _not_utf8(line: int, fields: list[str]) -> str:
    """Why a CSV record is not a row: its first byte that is not UTF-8, as the JSON Lines reader
    says it (the offset within its field, counted in bytes)."""
    for value in fields:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raw = value.encode("utf-8", "surrogateescape")
            return not_utf8(line, raw, len(value[:exc.start].encode("utf-8", "surrogateescape")), " of its field")
    return f"line {line} is not valid UTF-8"


def csv_batch(items: list[tuple[int, list[str] | str]], schema: pa.Schema) -> pa.RecordBatch:
    """Rows of ``schema`` (:func:`csv_layout`) from (line number, fields or error) records; a
    record that does not convert is a row with only :data:`LINE_ERROR` set, except one whose
    only fault is bytes that are not UTF-8: it keeps its fields (U+FFFD for those bytes), so its
    error row keeps its id."""
    names = [n for n in schema.names if n != LINE_ERROR]
    types = {f.name: f.type for f in schema if f.name != LINE_ERROR}
    errors = [r if isinstance(r, str) else None for _, r in items]
    good = [i for i, e in enumerate(errors) if e is None]
    empty = pa.schema([pa.field(n, types[n]) for n in names]).empty_table()
    try:
        table = _csv_parse([items[i][1] for i in good], names, types) if good else empty
    except CONVERT_ERRORS:  # find the records that do not convert, one by one
        parsed, kept = [], []
        for i in good:
            line, fields = items[i]
            try:
                parsed.append(_csv_parse([fields], names, types))
                kept.append(i)
            except UnicodeEncodeError:
                errors[i] = _not_utf8(line, fields)
                try:  # keep its other fields (its id above all) with U+FFFD for the bad bytes
                    parsed.append(_csv_parse([[_replaced(v) for v in fields]], names, types))
                    kept.append(i)
                except CONVERT_ERRORS:
                    pass
            except CONVERT_ERRORS as exc:
                errors[i] = f"line {line}: {str(exc).splitlines()[0]}"
        good = kept
        table = pa.concat_tables(parsed) if parsed else empty
    at = {i: k for k, i in enumerate(good)}
    table = table.take(pa.array([at.get(i) for i in range(len(items))], pa.int64()))
    columns = [table.column(n).combine_chunks() for n in names] + [pa.array(errors, pa.string())]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def csv_batches(f: IO[bytes], rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """A CSV shard's schema and its rows, ``rows`` at a time."""
    header, records = csv_records(f)
    head = list(itertools.islice(records, HEAD_ROWS))
    schema = csv_layout(header, head)
    return schema, (csv_batch(c, schema) for c in chunks(itertools.chain(head, records), rows))


def count_rows(fmt: str, f: IO[bytes]) -> int:
    """Rows of a JSON Lines (``jsonl``, ``openai_batch``: lines that are not blank) or CSV
    (records after the header) shard, read through once."""
    if fmt == "csv":
        return sum(1 for _ in csv_records(f)[1])
    return sum(1 for line in f if line.strip())


def line_errors(rows: pa.RecordBatch, first_row: int, errors: dict[int, str]) -> dict[int, str]:
    """``errors`` (row index -> why) and the rows of ``rows`` (from ``first_row``) whose
    :data:`LINE_ERROR` is set (those take precedence)."""
    if LINE_ERROR not in rows.schema.names:
        return errors
    bad = {first_row + i: e for i, e in enumerate(rows.column(LINE_ERROR).to_pylist()) if e is not None}
    return {**errors, **bad} if bad else errors
