"""The decode worker's host-DRAM tier (``offload=dram``) on real vLLM and real NIXL (CPU): a
request vLLM preempts for lack of decode KV blocks comes back from the tier. The tier's normal
path (one write per request in whole blocks, no prompt token recomputed, the prefill worker
letting go, the tier's record) is checked on the long-context run, :mod:`tests.engine.test_long_context`.
"""
from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT, Run, _run
from pipeline.io.metrics import read_request_metrics, read_worker_metrics

sys.path.insert(0, str(ROOT / "tools"))
from long_prompts import write_long_prompts  # noqa: E402

BLOCK = 128


def _steps(run: Run, role: str) -> list[dict]:
    return [r for r in read_worker_metrics(run.run_dir).to_pylist() if r["role"] == role]


# Preemption: short prompts (8 blocks each) and a decode KV cache of 16 usable blocks. While the
# first request decodes, the next two wait in the DRAM tier; when it ends both are admitted (16
# blocks), both grow, and vLLM preempts one. It must come back from the DRAM tier, not recompute
# its prompt.
P_ROWS, P_NEW, P_BLOCKS = 4, 160, 17
P_CONTEXT = ["model.max_model_len=2048", f"job.sampling.max_new_tokens={P_NEW}"]


@pytest.fixture(scope="module")
def short_input(tmp_path_factory):
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    d = tmp_path_factory.mktemp("short") / "input"
    write_long_prompts(d, load_tokenizer(compose(["+job=summarize"])), P_ROWS, 1, 930, 960)
    return d


@pytest.fixture(scope="module")
def preempt_run(tmp_path_factory, short_input) -> Run:
    return _run(tmp_path_factory, "dram-preempt", "pools=disaggregated", "offload=dram", "offload.dram_gib=1",
                f"model.decode_kv_blocks={P_BLOCKS}", *P_CONTEXT, input_url=str(short_input))


@pytest.fixture(scope="module")
def short_colocated_run(tmp_path_factory, short_input) -> Run:
    return _run(tmp_path_factory, "dram-preempt-colocated", "pools=colocated", *P_CONTEXT, input_url=str(short_input))


@pytest.mark.e2e
def test_preempted_request_comes_back_from_dram(preempt_run, short_colocated_run):
    rows = read_request_metrics(preempt_run.run_dir).to_pylist()
    assert all(-(-r["prompt_tokens"] // BLOCK) == 8 for r in rows)  # the setting: 2 x 8 = all 16 blocks
    decode = _steps(preempt_run, "decode")
    preempted = sum(s["preempted"] for s in decode)
    assert preempted >= 1, "no preemption happened; the scenario did not arise"
    loads = [(t, c, p) for s in decode for t, c, p in zip(s["kv_load_tokens"] or (), s["kv_load_recompute_tokens"] or (),
                                                          s["kv_load_after_preemption"] or ())]
    prompts = sorted(r["prompt_tokens"] for r in rows)
    assert sorted(t for t, _, p in loads if not p) == [n - 1 for n in prompts]  # each prompt loaded on admission
    assert all(c == 1 for _, c, p in loads if not p)
    # Back after a preemption, a request computes again only the tokens it had generated (plus
    # one): its prompt comes from the DRAM tier, or from vLLM's prefix cache where its freed
    # blocks were still cached, in which case there may be nothing to load at all.
    back = [(t, c) for t, c, p in loads if p]
    assert len(back) <= preempted
    assert all(t <= prompts[-1] - 1 and 2 <= c <= P_NEW + 1 for t, c in back), back
    assert sum(s["prompt_tokens_computed"] for s in decode) == P_ROWS
    got = preempt_run.rows("part-00000.parquet")
    want = short_colocated_run.rows("part-00000.parquet")
    assert [r["generation_token_ids"] for r in got] == [r["generation_token_ids"] for r in want]
