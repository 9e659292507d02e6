"""The RAG job's prompt source, run by each shard owner before prefill: validate the questions,
retrieve their passages batch by batch (CPU work, in a thread) and turn each batch into prompts
as soon as it is retrieved, so prefill starts while later questions are still being retrieved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pipeline.config import Config, RagConfig
from pipeline.io.prompts import Prompt, as_text, make_prompts

_retrievers: dict[tuple, Any] = {}


def retriever_for(rag: RagConfig):
    """The worker's :class:`~pipeline.rag.retrieve.Retriever` for ``rag`` (built once per process;
    building it loads the embedding model and loads or builds the corpus index)."""
    from pipeline.rag.retrieve import Retriever

    key = (rag.corpus, rag.embedding_model, rag.chunk_size, rag.overlap, rag.top_k, rag.index_dir)
    if key not in _retrievers:
        _retrievers[key] = Retriever(rag.corpus, rag.embedding_model, rag.chunk_size, rag.overlap,
                                     rag.top_k, cache_dir=rag.index_dir)
    return _retrievers[key]


async def rag_prompt_batches(questions: list[Prompt], texts: list[Any], cfg: Config,
                             tokenizer: Any) -> AsyncIterator[list[Prompt]]:
    """Yield ``questions`` (validated by :func:`make_prompts`, error rows included) in batches,
    each valid row's ``token_ids`` now those of its RAG prompt: the job's chat template around
    ``job.rag.template`` filled with the row's question and its ``top_k`` passages. Error rows
    come in the first batch. With ``prefix_routing``, each batch is ordered so that rows with the
    same passages (``prefix_key``) follow each other.

    Raises:
        FileNotFoundError, ValueError: the corpus cannot be read or indexed (the shard fails).
    """
    from pipeline.rag.retrieve import DEFAULT_TEMPLATE, build_prompt

    rag = cfg.job.rag
    retriever = await asyncio.to_thread(retriever_for, rag)
    yield [q for q in questions if q.error is not None]
    valid = [q for q in questions if q.error is None]
    template = rag.template or DEFAULT_TEMPLATE
    for start in range(0, len(valid), rag.retrieve_batch):
        batch = valid[start:start + rag.retrieve_batch]
        asked = [as_text(texts[q.row], cfg.job.text_column)[0] for q in batch]
        hits = await asyncio.to_thread(retriever.search, asked)
        rendered = make_prompts(
            [build_prompt(text, retriever.passages([h.passage_id for h in row]), template)
             for text, row in zip(asked, hits)],
            [q.row_key for q in batch], cfg.job, tokenizer, cfg.model.max_model_len)
        for q, row, r in zip(batch, hits, rendered):
            q.token_ids, q.error, q.truncated = r.token_ids, r.error, r.truncated
            q.passage_ids = [h.passage_id for h in row]
            q.passage_scores = [h.score for h in row]
            # The prompt's long shared part is the instructions and passage [1]: rows with the
            # same best passage share it, whatever follows.
            q.prefix_key = q.passage_ids[0] if rag.prefix_routing else None
        if rag.prefix_routing:
            batch.sort(key=lambda q: q.passage_ids or [])
        yield batch
