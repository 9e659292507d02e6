"""A context half again as long as the bundled model was trained for, through the decode DRAM
tier, on real vLLM and real NIXL (CPU; issue #18).

SmolLM2-135M (8,192 positions) runs at a 12,288-token context through vLLM's own
``hf_overrides`` (YaRN, factor 1.5; :func:`tools.long_prompts.yarn_context`), the longest that fits
the suite's budget: its 11.5K-token prefill takes about three minutes on one of these cores (a
16K one six, the 32K-token runs of ``tools/bench_dram.py --long`` longer; BENCHMARKS.md). One request of
11,500 document tokens and one short one, 1P:1D with ``offload=dram`` and a decode KV cache of
100 blocks (12,672 usable tokens: the long request, never two of them), against a colocated run
of the same rows with the same overrides. The hand-off timeout is shorter than the long prefill,
so the rows' DRAM-tier reservations live only by being renewed. Checked against independent sources: the colocated
run's tokens, vLLM's own per-step counters, the hand count of each request's KV blocks, and the
decode worker's record of its DRAM tier.
"""
from __future__ import annotations

import sys

import pytest

from pipeline.io.metrics import read_dram_use, read_request_metrics, read_worker_metrics
from tests.conftest import ROOT, Run, _run, last_core, start_run

sys.path.insert(0, str(ROOT / "tools"))
from long_prompts import write_prompts, yarn_context  # noqa: E402

CONTEXT, TRAINED = 12288, 8192
COUNTS = [11_500, 400]  # document tokens; the job's template adds a few dozen
NEW_TOKENS, DECODE_BLOCKS, BLOCK = 48, 100, 128
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M in float32: 46,080 B
LONG = [*yarn_context(CONTEXT, TRAINED), f"job.sampling.max_new_tokens={NEW_TOKENS}"]


@pytest.fixture(scope="module")
def long_input(tmp_path_factory):
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    d = tmp_path_factory.mktemp("long12k") / "input"
    write_prompts(d, load_tokenizer(compose(["+job=summarize"])), COUNTS)
    return d


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory, long_input) -> tuple[Run, Run]:
    """The DRAM-tier run and, beside it on the core its decode engine leaves idle during the
    long prefill, the colocated reference."""
    coloc = start_run(tmp_path_factory, "long12k-colocated", "pools=colocated", "pools.prefill=1", *LONG,
                      input_url=str(long_input), cpus=last_core())
    # transport.handoff_timeout_s=30: a DRAM-tier reservation no hand-off claims is released
    # after this long unless its prefill worker renews it; the long prefill (a minute or more)
    # outlasts it, so the reservations must be renewed for the rows to be served at the first try.
    dram = _run(tmp_path_factory, "long12k-dram", "pools=disaggregated", "offload=dram", "offload.dram_gib=1",
                f"model.decode_kv_blocks={DECODE_BLOCKS}", "transport.handoff_timeout_s=30", *LONG,
                input_url=str(long_input))
    return dram, coloc.wait()


@pytest.fixture(scope="module")
def long_dram_run(long_runs) -> Run:
    return long_runs[0]


@pytest.fixture(scope="module")
def long_colocated_run(long_runs) -> Run:
    return long_runs[1]


@pytest.mark.e2e
def test_long_context_through_the_dram_tier(long_dram_run, long_colocated_run):
    rows = sorted(read_request_metrics(long_dram_run.run_dir).to_pylist(), key=lambda r: r["prompt_tokens"])
    long = rows[-1]
    # The setting: a prompt well past the trained context, which the decode KV cache holds once
    # but not twice (vLLM keeps one block back).
    assert len(rows) == 2 and long["prompt_tokens"] > 11_000 > TRAINED
    # Served at the first try: the reservations outlived transport.handoff_timeout_s (30 s) by
    # being renewed, while the long prompt was prefilled for longer than that.
    assert [r["tries"] for r in rows] == [1, 1]
    assert long["prefill_end"] - long["read_at"] > 30
    assert long["prompt_tokens"] + NEW_TOKENS <= (DECODE_BLOCKS - 1) * BLOCK < 2 * long["prompt_tokens"]

    # Token for token what a colocated engine with the same context generates.
    got = long_dram_run.rows("part-00000.parquet")
    want = long_colocated_run.rows("part-00000.parquet")
    assert [r["error"] for r in got] == [None, None]
    assert [r["generation_token_ids"] for r in got] == [r["generation_token_ids"] for r in want]
    assert all(len(r["generation_token_ids"]) > 0 for r in got)

    # vLLM's counters on the decode engine: of each prompt it computed one token, the last;
    # the rest came from the DRAM tier.
    steps = read_worker_metrics(long_dram_run.run_dir).to_pylist()
    decode = [s for s in steps if s["role"] == "decode"]
    assert sum(s["prompt_tokens"] for s in decode) == sum(r["prompt_tokens"] for r in rows)
    assert sum(s["prompt_tokens_computed"] for s in decode) == len(rows)

    # One write per request of its whole blocks: ceil(prompt / 128) x 128 x 46,080 B (the long
    # one 91 blocks, 537 MB).
    blocks = [-(-r["prompt_tokens"] // BLOCK) for r in rows]
    moved = sorted(b for s in steps if s["role"] == "prefill" for b in (s["kv_transfer_bytes"] or ()))
    assert moved == sorted(n * BLOCK * KV_BYTES_PER_TOKEN for n in blocks)

    # The decode worker's record of its tier: both rows reserved their blocks before their
    # prefill (2 rows, 16 in flight: at once), so its peak is the two together; every slot was
    # released by the end.
    (tier,) = read_dram_use(long_dram_run.run_dir)
    assert tier["slot_bytes"] == BLOCK * KV_BYTES_PER_TOKEN and tier["block_tokens"] == BLOCK
    assert tier["peak_slots"] == sum(blocks)
    assert tier["use"][0][1] == 0 and tier["use"][-1][1] == 0
    assert max(u for _, u in tier["use"]) == tier["peak_slots"] <= tier["num_slots"]
