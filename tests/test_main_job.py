"""The main job end to end on real vLLM and real NIXL: disaggregated output equals colocated,
KV crossed between processes, every row once and in order, and the summary adds up."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.helpers import KV_BYTES_PER_TOKEN_FP32, SAMPLE

pytestmark = pytest.mark.e2e

SHARDS = sorted(p.name for p in SAMPLE.glob("*.parquet"))


@pytest.fixture(params=["push", "pull"])
def disagg_run(request):
    return request.getfixturevalue(f"{request.param}_run")


def test_colocated_equals_raw_vllm_on_the_tokenizers_own_prompts(colocated_run, reference):
    """The baseline every other run is compared with, against a reference that shares no code
    with the pipeline (tests/reference.py): each row's id, place, prompt length and greedy tokens
    equal raw vLLM's on the chat template's own rendering, read back with pyarrow alone."""
    for shard in SHARDS:
        out = pq.read_table(colocated_run.output / shard, columns=["id", "prompt_tokens", "generation_token_ids"])
        want = reference[shard]
        assert out.column("id").to_pylist() == [r["id"] for r in want]
        assert out.column("prompt_tokens").to_pylist() == [len(r["prompt_ids"]) for r in want]
        assert out.column("generation_token_ids").to_pylist() == [r["token_ids"] for r in want]


def test_disaggregated_greedy_output_equals_colocated(disagg_run, colocated_run):
    for shard in SHARDS:
        got, want = disagg_run.rows(shard), colocated_run.rows(shard)
        assert len(got) == len(want) == 8
        for g, w in zip(got, want):
            assert g["error"] is None and w["error"] is None
            assert g["generation_token_ids"] == w["generation_token_ids"], g["id"]
            assert g["generation"] == w["generation"]
            assert g["output_tokens"] == w["output_tokens"] > 0


def test_kv_crossed_between_two_processes(disagg_run):
    for shard in SHARDS:
        for row in disagg_run.rows(shard):
            assert row["prefill_worker"].startswith("prefill-")
            assert row["decode_worker"].startswith("decode-")
            assert row["prefill_worker"] != row["decode_worker"]
            # The decode engine computed at most the last prompt token itself; the rest of the
            # prompt's KV came over NIXL.
            assert row["prompt_tokens"] - 1 <= row["kv_tokens"] <= row["prompt_tokens"]
            assert row["kv_bytes"] == row["kv_tokens"] * KV_BYTES_PER_TOKEN_FP32
            assert row["kv_handoff_s"] is not None and row["kv_handoff_s"] >= 0


def test_each_engine_was_recorded_ready_before_it_served_a_row(disagg_run):
    """What the start-up line (``starting engines: prefill 0/1, decode 1/1 ready``) counts: one
    record per engine, written after its start and before its first row, by the request
    metrics' own times (prefill start on the prefill worker, arrival on the decode worker)."""
    import json

    from pipeline.io.metrics import read_request_metrics

    engines = {json.loads(f.read_text())["worker"].split("@")[0]: json.loads(f.read_text())
               for f in (disagg_run.run_dir / "engines").glob("*.json")}
    assert set(engines) == {"prefill-0", "decode-0"}
    assert engines["prefill-0"]["role"] == "prefill" and engines["decode-0"]["role"] == "decode"
    m = read_request_metrics(disagg_run.run_dir).to_pylist()
    for e in engines.values():
        assert 5 < e["ready_at"] - e["started_at"] < 600, e  # an engine start, not a no-op
    assert engines["prefill-0"]["ready_at"] <= min(r["prefill_start"] for r in m)
    assert engines["decode-0"]["ready_at"] <= min(r["decode_arrived_at"] for r in m)


def test_pull_reads_kv_in_the_step_that_computes_the_first_token(pull_run):
    # transport.sync_kv_load (the default): the decode engine READs a hand-off's KV in the step
    # that schedules it, so the step that records a request's NIXL READ (vLLM's own transfer
    # telemetry) also computes that request's last prompt token (vLLM's own counter). With
    # vLLM's asynchronous load the READ completes one or more steps before the request is
    # scheduled: those steps record transfers and compute no prompt token.
    from pipeline.io.metrics import read_worker_metrics

    steps = [s for s in read_worker_metrics(pull_run.run_dir).to_pylist() if s["role"] == "decode"]
    reads = [(len(s["kv_transfer_s"] or []), s["prompt_tokens_computed"]) for s in steps
             if s["kv_transfer_s"] or s["prompt_tokens_computed"]]
    assert sum(n for n, _ in reads) == 24, reads  # one READ per row
    assert all(n == computed for n, computed in reads), reads


def test_colocated_rows_record_no_handoff(colocated_run):
    for row in colocated_run.rows(SHARDS[0]):
        assert row["prefill_worker"].startswith("colocated-")
        assert row["decode_worker"] is None and row["kv_handoff_s"] is None
        assert row["kv_tokens"] == 0


@pytest.mark.parametrize("name", ["colocated", "push", "pull"])
def test_every_input_row_once_in_order_with_passthrough(request, name):
    run = request.getfixturevalue(f"{name}_run")
    assert sorted(p.name for p in run.output.glob("*.parquet")) == SHARDS
    assert not [p for p in run.output.iterdir() if p.name.startswith(".")], "temporary files left"
    for shard in SHARDS:
        src = pq.read_table(SAMPLE / shard)
        out = run.table(shard)
        assert out.column("id").to_pylist() == src.column("id").to_pylist()
        assert out.column("module").to_pylist() == src.column("module").to_pylist()
        assert out.column("chars").to_pylist() == src.column("chars").to_pylist()
        assert out.schema.field("chars").type == src.schema.field("chars").type
        assert "text" not in out.column_names


@pytest.mark.parametrize("name", ["colocated", "push"])
def test_summary_matches_output(request, name):
    run = request.getfixturevalue(f"{name}_run")
    rows = [r for s in SHARDS for r in run.rows(s)]
    summary = run.summary()
    assert summary["rows"] == len(rows) == 24
    assert summary["errors"] == sum(r["error"] is not None for r in rows) == 0
    assert summary["output_tokens"] == sum(r["output_tokens"] for r in rows)
    assert summary["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows)
    assert summary["shards_done"] == 3
    assert f"rows {len(rows)}: {len(rows)} generated, 0 errors" in run.stdout
    assert "output tok/s" in run.stdout and "wall" in run.stdout
    assert str(run.run_dir) in run.stdout
    assert (run.run_dir / "config.yaml").exists()
