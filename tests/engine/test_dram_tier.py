"""The decode worker's host-DRAM tier (``offload=dram``) on real vLLM and real NIXL (CPU): a
request vLLM preempts for lack of decode KV blocks comes back from the tier, with the prefill
pool at TP 3 and decode at TP 1 (issue #28): each of the 3 prefill ranks writes its own KV head's
bytes of every block into the tier, which holds all three, and decode reads whole blocks. The tier's normal
path (one write per request in whole blocks, no prompt token recomputed, the prefill worker
letting go, the tier's record) is checked on the long-context run, :mod:`tests.engine.test_long_context`.
"""
from __future__ import annotations

import pytest

from pipeline.io.metrics import read_request_metrics, read_worker_metrics
from tests.helpers import Run
from tests.helpers import run_to_end
from tools.long_prompts import write_long_prompts

BLOCK = 128


def _steps(run: Run, role: str) -> list[dict]:
    return [r for r in read_worker_metrics(run.run_dir).to_pylist() if r["role"] == role]


# Preemption: short prompts (8 blocks each) and a decode KV cache of 16 usable blocks. While the
# first request decodes, the next two wait in the DRAM tier; when it ends both are admitted (16
# blocks), both grow, and vLLM preempts one. It must come back from the DRAM tier, not recompute
# its prompt. The prefill pool runs at TP 3 (SmolLM2's 3 KV heads, one per rank). The prompts
# are 970-1002 tokens (930-960 of text and the template's), so a request needs a 9th block after
# 22-54 new tokens. The prefill engine hands the rows over in pairs, ~6 s apart on these cores:
# P_NEW = 128 (~8 s of decode alone) keeps a request decoding until the next pair waits, so two
# are admitted together and one is preempted (at 160, seen: 3 preemptions; at 96, 6 s of decode
# alone, too close to the pairs' spacing to count on it).
P_ROWS, P_NEW, P_BLOCKS, P_TP = 4, 128, 17, 3
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M in float32: 46,080 B
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
    return run_to_end(tmp_path_factory, "dram-preempt", "pools=disaggregated", "offload=dram", "offload.dram_gib=1",
                f"model.decode_kv_blocks={P_BLOCKS}", f"model.prefill_tp={P_TP}", *P_CONTEXT,
                input_url=str(short_input))


@pytest.fixture(scope="module")
def short_colocated_run(tmp_path_factory, short_input) -> Run:
    return run_to_end(tmp_path_factory, "dram-preempt-colocated", "pools=colocated", *P_CONTEXT, input_url=str(short_input))


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
    # one): its prompt comes from the DRAM tier, past whatever of its freed blocks vLLM's prefix
    # cache still held. That cache holds only full blocks, and the running request's next block
    # evicts the preempted one's last (vLLM frees a request's blocks tail first), so the tail of
    # its prompt (prompt - 1 - 7 x 128 tokens: dozens here) is loaded from the tier: at least one
    # load after a preemption, each bringing tokens. The counts alone would not show the tier
    # serving it: a request back from the prefix cache alone computes no more prompt tokens.
    back = [(t, c) for t, c, p in loads if p]
    assert 1 <= len(back) <= preempted, (back, preempted)
    assert all(1 <= t <= prompts[-1] - 1 and 2 <= c <= P_NEW + 1 for t, c in back), back
    assert sum(s["prompt_tokens_computed"] for s in decode) == P_ROWS
    got = preempt_run.rows("part-00000.parquet")
    want = short_colocated_run.rows("part-00000.parquet")
    assert [r["generation_token_ids"] for r in got] == [r["generation_token_ids"] for r in want]
    # TP 3 into the tier: the prefill engine ran 3 model-worker processes, and each request's
    # blocks were written as 3 NIXL writes (one per rank: its KV head, a third of each block's
    # bytes), adding up to every head of every block once: ceil(prompt / 128) x 128 x 46,080 B.
    engines = preempt_run.engines()
    assert (engines["prefill"]["tp"], engines["prefill"]["worker_processes"]) == (P_TP, P_TP), engines
    assert (engines["decode"]["tp"], engines["decode"]["worker_processes"]) == (1, 1), engines
    writes = sorted(b for s in _steps(preempt_run, "prefill") for b in (s["kv_transfer_bytes"] or ()))
    want_bytes = sorted(-(-r["prompt_tokens"] // BLOCK) * BLOCK * KV_BYTES_PER_TOKEN // P_TP
                        for r in rows for _ in range(P_TP))
    assert writes == want_bytes
