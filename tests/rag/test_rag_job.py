"""The RAG job end to end (real embedding model, real vLLM, real NIXL): one answer row per
question with its passages, and the disaggregated answers equal the colocated ones."""

from __future__ import annotations

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.helpers import ROOT, PendingRun, last_core
from pipeline.rag.job import retriever_for
from pipeline.config import compose

pytestmark = pytest.mark.e2e
RAG = ["+job=rag", "model.dtype=float32", "run.progress=false", "job.sampling.max_new_tokens=16"]


def _start(base, *overrides, cpus: set[int] | None = None) -> PendingRun:
    base.mkdir()
    return PendingRun(base.name, base, [*RAG, f"run.dir={base / 'run'}", f"job.output={base / 'output'}", *overrides],
                      cpus)


def test_rag_job_disaggregated_equals_colocated(tmp_path):
    questions = pq.read_table(ROOT / "data" / "rag" / "questions.parquet")
    # Colocated beside the 1P:1D run (pull, the default), on the core it leaves idle (tests.conftest.start_run).
    coloc = _start(tmp_path / "coloc", "pools=colocated", cpus=last_core())
    disagg = _start(tmp_path / "disaggregated", "pools=disaggregated").wait()
    disagg, coloc = (ds.dataset(r.output, format="parquet").to_table() for r in (disagg, coloc.wait()))
    assert disagg.column("id").to_pylist() == questions.column("id").to_pylist()
    assert disagg.column("error").null_count == disagg.num_rows
    assert disagg.column("generation_token_ids").to_pylist() == coloc.column("generation_token_ids").to_pylist()
    # The passages in each row are the retriever's own answer for that question (asked here
    # directly), best first, three of them.
    retriever = retriever_for(compose(["+job=rag"]).job.rag)
    want = retriever.search(questions.column("question").to_pylist())
    assert disagg.column("passage_ids").to_pylist() == [[h.passage_id for h in row] for row in want]
    assert all(len(s) == 3 and s == sorted(s, reverse=True) for s in disagg.column("passage_scores").to_pylist())
    # Every prompt's KV crossed over NIXL (minus at most the last token, which decode computes).
    for row in disagg.to_pylist():
        assert row["prompt_tokens"] - 1 <= row["kv_tokens"] <= row["prompt_tokens"]
