"""Questions -> passages -> prompts: the retrieval half of the RAG job.

    r = Retriever("data/rag/corpus.parquet", top_k=5)
    for batch in r.retrieve_stream(questions, batch=16):      # one batch at a time
        for item in batch:
            texts = r.passages([h.passage_id for h in item.hits])
            prompt = build_prompt(item.question, texts)       # -> prefill
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from pipeline.io.prompts import fill_template, parse_template
from pipeline.model.resolve import cache_dir
from pipeline.rag.corpus import check_chunking, load_passages
from pipeline.rag.embed import DEFAULT_MODEL, Encoder
from pipeline.rag.index import Index

DEFAULT_TEMPLATE = (
    "Answer the question using only the numbered passages below. After each statement, cite "
    "the passages it comes from by their numbers in square brackets, like [2]. If the passages "
    "do not contain the answer, say that they do not.\n\n"
    "Passages:\n{passages}\n\n"
    "Question: {question}\n"
    "Answer:"
)
TEMPLATE_SLOTS = ("passages", "question")  # the placeholders of job.rag.template


class Hit(NamedTuple):
    """One retrieved passage: its id (``"<doc id>#<chunk>"``) and cosine similarity in [-1, 1]."""

    passage_id: str
    score: float


class Retrieval(NamedTuple):
    """One question and its passages, best first."""

    question: str
    hits: list[Hit]


def default_cache_dir() -> Path:
    """``$PD_PIPELINE_CACHE/rag`` or ``~/.cache/pd-pipeline/rag``: local and writable even when
    the corpus is on an object store or a read-only share. On a cluster, point ``cache_dir`` at
    a shared file system so every worker reuses one index."""
    return cache_dir() / "rag"


class Retriever:
    """Dense retrieval over a Parquet passage corpus.

    Args:
        corpus_url: Parquet file, directory or glob, any fsspec URL; one document per row.
        model: embedding model: ``"all-MiniLM-L6-v2"`` (bundled, the default), a local
            sentence-transformers directory, or a hub id.
        chunk_size: words per passage (see :mod:`pipeline.rag.corpus` for the unit).
        overlap: words shared by consecutive passages of a document, ``0 <= overlap < chunk_size``.
        top_k: passages returned per question.
        cache_dir: where indexes live (default :func:`default_cache_dir`); each index is the
            subdirectory named by its key.
        id_column, text_column, title_column: corpus columns; the title (when present) heads
            each passage.
        batch_size: passages per index batch file (the unit a resumed build skips).
        device: torch device for the embedding model (default: CUDA when present, else CPU).

    Construction reads and chunks the corpus and loads the index, building it when no complete
    one exists for this (corpus, model, chunking).

    Raises:
        FileNotFoundError: no corpus at ``corpus_url``.
        ValueError: bad chunking or ``top_k``, missing columns, repeated document ids, an empty corpus.
    """

    def __init__(self, corpus_url: str, model: str = DEFAULT_MODEL, chunk_size: int = 128,
                 overlap: int = 32, top_k: int = 5, cache_dir: str | os.PathLike | None = None, *,
                 id_column: str = "id", text_column: str = "text", title_column: str | None = "title",
                 batch_size: int = 256, device: str | None = None):
        check_chunking(chunk_size, overlap)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.top_k = top_k
        passages = load_passages(corpus_url, chunk_size, overlap, id_column, text_column, title_column)
        self.encoder = Encoder(model, device=device)
        self.index = Index(passages, self.encoder, chunk_size, overlap,
                           cache_dir if cache_dir is not None else default_cache_dir(), batch_size)
        self._text = {p.id: p.text for p in passages}
        self.passage_ids = [p.id for p in passages]

    def search(self, questions: list[str], top_k: int | None = None) -> list[list[Hit]]:
        """The ``top_k`` (default: the retriever's) best passages for each question, best first."""
        idx, scores = self.index.search(self.encoder.queries(list(questions)), top_k or self.top_k)
        return [[Hit(self.passage_ids[i], float(s)) for i, s in zip(row_i, row_s)]
                for row_i, row_s in zip(idx.tolist(), scores.tolist())]

    def passages(self, ids: Iterable[str]) -> list[str]:
        """The texts of the passages ``ids`` (title, blank line, chunk), in order.

        Raises:
            KeyError: an id not in the corpus.
        """
        return [self._text[i] for i in ids]

    def retrieve_stream(self, questions: Iterable[str], batch: int = 32) -> Iterator[list[Retrieval]]:
        """Retrieve ``batch`` questions at a time from any iterable (read lazily), yielding each
        batch's results as soon as they are ready, so prompts for the first batch can be
        prefilled while later ones are retrieved."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        pending: list[str] = []
        for q in questions:
            pending.append(q)
            if len(pending) == batch:
                yield [Retrieval(q, h) for q, h in zip(pending, self.search(pending))]
                pending = []
        if pending:
            yield [Retrieval(q, h) for q, h in zip(pending, self.search(pending))]


def format_passages(passages: list[str]) -> str:
    """``[1] first passage\\n\\n[2] second ...``: numbered from 1, in the order given."""
    return "\n\n".join(f"[{n}] {text.strip()}" for n, text in enumerate(passages, start=1))


def build_prompt(question: str, passages: list[str], template: str = DEFAULT_TEMPLATE) -> str:
    """The RAG prompt: ``template`` read like ``str.format`` (``{{`` and ``}}`` are literal
    braces) with ``{question}`` and ``{passages}`` (the passages numbered ``[1]``, ``[2]``, ... by
    :func:`format_passages`) filled in wherever they appear. The values are inserted as they
    are, so slot names or braces inside the question or passages stay as written.

    Raises:
        ValueError: the template lacks ``{question}`` or ``{passages}``, has another
            placeholder, a format spec, or a single brace (``job.rag.template: ...``).
    """
    parts = parse_template(template, "job.rag.template", TEMPLATE_SLOTS, TEMPLATE_SLOTS)
    return fill_template(parts, {"question": question.strip(), "passages": format_passages(passages)})
