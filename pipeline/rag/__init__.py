"""Retrieval for the RAG job: a Parquet passage corpus, a cached embedding index, questions ->
numbered passages -> prompts. See :class:`pipeline.rag.retrieve.Retriever`."""

from pipeline.rag.corpus import Passage, chunk_spans, chunk_text, load_passages
from pipeline.rag.embed import DEFAULT_MODEL, Encoder, resolve_model
from pipeline.rag.index import Index, exact_search
from pipeline.rag.retrieve import (DEFAULT_TEMPLATE, Hit, Retrieval, Retriever, build_prompt,
                                   default_cache_dir, format_passages)

__all__ = [
    "DEFAULT_MODEL", "DEFAULT_TEMPLATE", "Encoder", "Hit", "Index", "Passage", "Retrieval",
    "Retriever", "build_prompt", "chunk_spans", "chunk_text", "default_cache_dir", "exact_search",
    "format_passages", "load_passages", "resolve_model",
]
