"""Passage corpus: read documents from Parquet shards and cut them into overlapping passages.

A corpus is one Parquet file, a directory of them or a glob, at any fsspec URL (the same forms as
``job.input``, read with :mod:`pipeline.io.shards`). Each row is one document with an id column
and a text column, and optionally a title column.

**Chunking unit: words**, i.e. maximal runs of non-whitespace characters (``\\S+``). Words, not
the embedding model's tokens, so passage ids do not depend on the tokenizer and a chunk can be
checked by hand. A chunk of ``size`` words starts every ``size - overlap`` words; the last chunk
ends at the document's last word. Each passage's text is the document's own text from its first
word to its last (line breaks and indentation kept). For all-MiniLM-L6-v2, whose input is cut at
256 word-pieces, English prose runs about 1.3 word-pieces per word and code-heavy text up to ~2,
so keep ``size`` at or below about 128 words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from pipeline.io.shards import list_shards, read_shard

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Passage:
    """One chunk of one document. ``id`` is ``"<doc id>#<chunk index>"`` (index from 0);
    ``text`` is what is embedded, searched and shown to the model: the document's title (when
    the corpus has one) and a blank line, then the chunk."""

    id: str
    doc_id: str
    chunk: int
    text: str


def chunk_spans(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the chunks of ``text``: ``size`` words each, a new
    chunk every ``size - overlap`` words, the last one ending at the last word.

    Example: 10 words, ``size=4``, ``overlap=1`` -> words [0, 4), [3, 7), [6, 10).
    A text without words has no chunks.

    Raises:
        ValueError: ``size < 1`` or ``overlap`` not in ``[0, size)``.
    """
    check_chunking(size, overlap)
    words = [m.span() for m in _WORD.finditer(text)]
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(words):
        end = min(start + size, len(words))
        spans.append((words[start][0], words[end - 1][1]))
        if end == len(words):
            break
        start += size - overlap
    return spans


def chunk_text(text: str, size: int, overlap: int) -> list[str]:
    """The chunks of ``text`` as strings (see :func:`chunk_spans`)."""
    return [text[a:b] for a, b in chunk_spans(text, size, overlap)]


def check_chunking(size: int, overlap: int) -> None:
    """Raises ValueError unless ``size >= 1`` and ``0 <= overlap < size`` (words)."""
    if size < 1:
        raise ValueError(f"chunk_size must be >= 1 word, got {size}")
    if not 0 <= overlap < size:
        raise ValueError(f"overlap must be in [0, chunk_size={size}) words, got {overlap}")


def read_documents(corpus_url: str, id_column: str = "id", text_column: str = "text",
                   title_column: str | None = "title") -> pa.Table:
    """All documents of the corpus as one table with columns ``id`` (string), ``text`` and
    ``title`` (string or null), in shard order then row order.

    ``title_column`` is used when the corpus has it; ``None`` ignores titles.

    Raises:
        FileNotFoundError: no Parquet file at ``corpus_url``.
        ValueError: a shard lacks the id or text column.
    """
    tables = []
    for shard in list_shards(corpus_url):
        t = read_shard(shard)
        for col in (id_column, text_column):
            if col not in t.column_names:
                raise ValueError(f"corpus {shard.url}: no column {col!r} (columns: {t.column_names})")
        titles = (t.column(title_column).cast(pa.string())
                  if title_column and title_column in t.column_names
                  else pa.nulls(t.num_rows, pa.string()))
        tables.append(pa.table({"id": t.column(id_column).cast(pa.string()),
                                "text": t.column(text_column).cast(pa.string()),
                                "title": titles}))
    return pa.concat_tables(tables)


def make_passages(docs: pa.Table, size: int, overlap: int) -> list[Passage]:
    """Chunk every document of ``docs`` (columns ``id``, ``text``, ``title``, as from
    :func:`read_documents`). Documents with a null or blank text give no passages.

    Raises:
        ValueError: a null or repeated document id, or bad chunking parameters.
    """
    check_chunking(size, overlap)
    seen: set[str] = set()
    out: list[Passage] = []
    for row in docs.to_pylist():
        doc_id, text, title = row["id"], row["text"], row["title"]
        if doc_id is None:
            raise ValueError("corpus: a document has a null id")
        if doc_id in seen:
            raise ValueError(f"corpus: document id {doc_id!r} appears more than once")
        seen.add(doc_id)
        for i, chunk in enumerate(chunk_text(text or "", size, overlap)):
            body = f"{title}\n\n{chunk}" if title else chunk
            out.append(Passage(id=f"{doc_id}#{i}", doc_id=doc_id, chunk=i, text=body))
    return out


def load_passages(corpus_url: str, size: int, overlap: int, id_column: str = "id",
                  text_column: str = "text", title_column: str | None = "title") -> list[Passage]:
    """:func:`read_documents` then :func:`make_passages`."""
    return make_passages(read_documents(corpus_url, id_column, text_column, title_column), size, overlap)
