"""A context half again as long as the bundled model was trained for, through the decode DRAM
tier, on real vLLM and real NIXL (CPU; issue #18).

SmolLM2-135M (8,192 positions) runs at a 12,288-token context through vLLM's own
``hf_overrides`` (YaRN, factor 1.5; :func:`tools.long_prompts.yarn_context`), the longest that fits
the suite's budget: its 11.5K-token prefill took about a minute on one of these cores at the last
measure, three at an earlier one (a 16K one six, the 32K-token runs of ``tools/bench_dram.py --long`` longer; BENCHMARKS.md). One request of
11,500 document tokens, one of 4,500 and one short one, 1P:1D with ``offload=dram`` and a decode
KV cache of 100 blocks (12,672 usable tokens: the long request, never with the 4,500-token one,
so one of them waits in the DRAM tier while the other decodes), against a colocated run of the
same rows with the same overrides. This one run carries every check of the DRAM tier's normal
path (the preemption case runs in :mod:`tests.engine.test_dram_tier`). The rows' DRAM-tier
reservations must outlive the hand-off timeout by being renewed: the test stops the prefill
engine (SIGSTOP) for longer than that timeout once both engines are up, so every row waits for
its prefill longer than the timeout on any machine, however fast its prefill. Checked against independent sources: the colocated
run's tokens, vLLM's own per-step counters, the hand count of each request's KV blocks, and the
decode worker's record of its DRAM tier, and the prefill worker's own NIXL timings.
"""
from __future__ import annotations

import json
import signal
import time

import pytest

from pipeline.io.metrics import read_dram_use, read_request_metrics, read_worker_metrics
from tests.helpers import Run, last_core, start_run
from tools.long_prompts import write_prompts, yarn_context

CONTEXT, TRAINED = 12288, 8192
COUNTS = [11_500, 4_500, 400]  # document tokens; the job's template adds a few dozen
NEW_TOKENS, DECODE_BLOCKS, BLOCK = 48, 100, 128
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M in float32: 46,080 B
LONG = [*yarn_context(CONTEXT, TRAINED), f"job.sampling.max_new_tokens={NEW_TOKENS}"]
# transport.handoff_timeout_s: a DRAM-tier reservation no hand-off claims is released after this
# long unless its prefill worker renews it (it also bounds a hand-off's wait for its result, which
# the long row's decode must stay under). The prefill engine is stopped for longer than that.
HANDOFF_TIMEOUT_S, STALL_S = 30, 38


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
    dram = start_run(tmp_path_factory, "long12k-dram", "pools=disaggregated", "offload=dram", "offload.dram_gib=1",
                     f"model.decode_kv_blocks={DECODE_BLOCKS}", f"transport.handoff_timeout_s={HANDOFF_TIMEOUT_S}",
                     *LONG, input_url=str(long_input))
    _stall_prefill_engine(dram.base / "run", dram.proc, STALL_S)
    return dram.wait(), coloc.wait()


def _stall_prefill_engine(run_dir, driver, seconds: float) -> None:
    """Once both engines of the 1P:1D run at ``run_dir`` are up, stop the prefill worker's engine
    processes (its descendants: the engine core and its model worker) with SIGSTOP for
    ``seconds``, as a hung engine would be, while the worker itself goes on (it reserves the
    rows' DRAM-tier slots, hands them to its stopped engine and renews the reservations). The
    prefill worker's process runs under its local job, whose id is the pid of submitit's
    wrapper (``RUN_DIR/jobs.json``), in submitit's ``submitit.core._submit``. Returns early, doing
    nothing, if the run ends first (its wait then says why)."""
    import psutil

    deadline = time.monotonic() + 600
    while True:
        roles = set()
        for f in (run_dir / "engines").glob("*.json"):
            try:
                roles.add(json.loads(f.read_text())["role"])
            except (OSError, ValueError, KeyError):
                pass  # being written
        if {"prefill", "decode"} <= roles and (run_dir / "jobs.json").exists():
            break
        if driver.poll() is not None:
            return
        assert time.monotonic() < deadline, "the engines did not come up within 600 s"
        time.sleep(0.05)
    (pid,) = json.loads((run_dir / "jobs.json").read_text())["array_tasks"]
    job = psutil.Process(int(pid))
    (worker,) = [p for p in (job, *job.children(recursive=True)) if "submitit.core._submit" in p.cmdline()]
    engine = worker.children(recursive=True)
    assert any("EngineCore" in " ".join(p.cmdline()) for p in engine), [p.cmdline() for p in engine]
    for p in engine:
        p.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the stall itself
    finally:
        for p in engine:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass


@pytest.fixture(scope="module")
def long_dram_run(long_runs) -> Run:
    return long_runs[0]


@pytest.fixture(scope="module")
def long_colocated_run(long_runs) -> Run:
    return long_runs[1]


def _steps(run: Run, role: str) -> list[dict]:
    return [s for s in read_worker_metrics(run.run_dir).to_pylist() if s["role"] == role]


@pytest.mark.e2e
def test_long_context_through_the_dram_tier(long_dram_run, long_colocated_run):
    rows = sorted(read_request_metrics(long_dram_run.run_dir).to_pylist(), key=lambda r: r["prompt_tokens"])
    long = rows[-1]
    # The setting: a prompt well past the trained context, which the decode KV cache holds once
    # but not twice (vLLM keeps one block back), nor together with the 4,500-token one.
    assert len(rows) == len(COUNTS) and long["prompt_tokens"] > 11_000 > TRAINED
    assert all(c <= r["prompt_tokens"] for c, r in zip(sorted(COUNTS), rows))
    assert long["prompt_tokens"] + NEW_TOKENS <= (DECODE_BLOCKS - 1) * BLOCK < 2 * long["prompt_tokens"]
    assert long["prompt_tokens"] + rows[-2]["prompt_tokens"] > (DECODE_BLOCKS - 1) * BLOCK
    # Served at the first try: the reservations outlived transport.handoff_timeout_s (30 s) by
    # being renewed, each row waiting longer than that between its reservation (before
    # prefill_start) and its prefill's end (the prefill engine was stopped for 38 s).
    assert [r["tries"] for r in rows] == [1] * len(rows)
    assert min(r["prefill_end"] - r["prefill_start"] for r in rows) > HANDOFF_TIMEOUT_S, rows

    # Token for token what a colocated engine with the same context generates.
    got = long_dram_run.rows("part-00000.parquet")
    want = long_colocated_run.rows("part-00000.parquet")
    assert [r["error"] for r in got] == [None] * len(rows)
    assert [r["generation_token_ids"] for r in got] == [r["generation_token_ids"] for r in want]
    assert all(len(r["generation_token_ids"]) > 0 for r in got)

    # vLLM's counters on the decode engine: of each prompt it computed one token, the last
    # (whose logits give the first output token, as in vLLM's P/D); the rest came from the DRAM
    # tier. Without the tier it would compute all of them.
    decode = _steps(long_dram_run, "decode")
    assert sum(s["prompt_tokens"] for s in decode) == sum(r["prompt_tokens"] for r in rows)
    assert sum(s["prompt_tokens_computed"] for s in decode) == len(rows)
    assert sum(s["generation_tokens"] for s in decode) == sum(r["output_tokens"] for r in rows)

    # One write per request of its whole blocks: ceil(prompt / 128) x 128 x 46,080 B (the long
    # one 91 blocks, 537 MB).
    blocks = [-(-r["prompt_tokens"] // BLOCK) for r in rows]
    prefill = _steps(long_dram_run, "prefill")
    moved = sorted(b for s in prefill for b in (s["kv_transfer_bytes"] or ()))
    assert moved == sorted(n * BLOCK * KV_BYTES_PER_TOKEN for n in blocks)
    # Coalesced: one descriptor per layer region (30 layers; K and V in one region or two) and
    # run of consecutive blocks, so a handful of runs per request instead of one descriptor per
    # block and region (30 x 4-91 at least).
    descs = [d for s in prefill for d in (s["kv_transfer_descriptors"] or ())]
    assert len(descs) == len(rows) and all(d % 30 == 0 and d <= 8 * 30 for d in descs), descs

    # The decode worker's record of its tier: every row reserved its blocks before its prefill
    # (all rows in flight at once), so its peak is all of them together (1 GiB / (128 x 46,080 B)
    # = 182 slots hold them); every slot was released by the end.
    (tier,) = read_dram_use(long_dram_run.run_dir)
    assert tier["slot_bytes"] == BLOCK * KV_BYTES_PER_TOKEN and tier["block_tokens"] == BLOCK
    assert tier["peak_slots"] == sum(blocks)
    assert tier["use"][0][1] == 0 and tier["use"][-1][1] == 0
    assert max(u for _, u in tier["use"]) == tier["peak_slots"] <= tier["num_slots"]
    # So no prefill waited for decode capacity, although the decode KV cache holds one of the
    # two longer requests at a time.
    assert all(r["capacity_wait_s"] is not None and r["capacity_wait_s"] < 1.0 for r in rows)


@pytest.mark.e2e
def test_prefill_lets_go_within_one_transfer(long_dram_run):
    """The prefill worker's copy of each request's KV is no longer needed within one transfer
    time of its prefill ending: from the request finishing to NIXL reporting its write done
    (``kv_held_s``), against the write's own duration (``kv_transfer_s``) plus 0.1 s for the
    wait until the next engine step starts. Measured by the prefill engine's connector."""
    prefill = _steps(long_dram_run, "prefill")
    held = [h for s in prefill for h in (s["kv_held_s"] or ())]
    xfer = [t for s in prefill for t in (s["kv_transfer_s"] or ())]
    assert len(held) == len(xfer) == len(COUNTS)
    for h, t in zip(held, xfer):
        assert h <= t + 0.1, (held, xfer)
    # vLLM itself frees the blocks at the end of the engine step in which the write completed.
    # The record of it reaches the worker with the next step's metadata, so a free in the engine's
    # last step is never recorded (seen: 2 of 3, the short row's lost): at least the long row's,
    # which the other rows' prefill steps follow (none recorded would have passed an all() of
    # nothing).
    freed = [f for s in prefill for f in (s["kv_freed_s"] or ())]
    assert 1 <= len(freed) <= len(COUNTS) and all(f > 0 for f in freed), freed
