"""vLLM engine arguments and each pool's shape reach the engines they are meant for, on real
engines and real NIXL.

Two short runs of one shard of the sample (8 rows, all in flight at once) with the same
settings: model.engine_kwargs for every engine (max_num_seqs=3, prefix caching off),
model.decode_engine_kwargs.max_num_seqs=2 and model.prefill_engine_kwargs.enable_prefix_caching=true
for their pools; both disaggregated, each pool its own tensor parallel size (issue #28): push
with decode at TP 3 (prefill 1), pull with prefill at TP 3 (decode 1). How the dicts merge for
each role, colocated included, is checked without engines in tests/engine/test_engine_args.py. SmolLM2-135M
has 9 attention heads and 3 KV heads, so 3 is its only TP size above 1; on this machine's CPU
backend the 3 ranks of an engine share their worker's core.

What each engine ran with is read from its per-step metrics (pipeline.io.metrics.read_worker_metrics):
the most requests it ran at once (``running``) and its prefix-cache lookups
(``prefix_cache_queries``: 0 with prefix caching off; thousands on this data with it on, as
every default run shows); and from its record in the run directory: the TP size and block size
vLLM resolved, and its model-worker processes as the operating system counts them. That the KV
was re-laid out between the shapes is checked against the suite's independent reference (raw
vLLM ``LLM.generate`` in float32 on the tokenizer's own prompts, tests/reference.py; its first
16 tokens: greedy decoding's first tokens do not depend on how many follow), vLLM's own
counters (prompt tokens the decode engine computed; NIXL transfers and bytes) and a hand count
of the bytes.
"""

from __future__ import annotations

import pytest

from pipeline.io.metrics import read_request_metrics, read_worker_metrics
from tests.helpers import KV_BYTES_PER_TOKEN_FP32, SAMPLE, Run, run_to_end

SHARDS = ["part-00000.parquet"]
BLOCK = 128  # vLLM's default KV block size on CPU, in tokens
MAX_NEW_TOKENS = 16  # the reference generates the job's 48; greedy, its first 16 are these runs'
KWARGS = [
    f"job.sampling.max_new_tokens={MAX_NEW_TOKENS}", "model.seed=1234",
    "model.engine_kwargs.max_num_seqs=3", "model.engine_kwargs.enable_prefix_caching=false",
    "model.decode_engine_kwargs.max_num_seqs=2", "+model.prefill_engine_kwargs.enable_prefix_caching=true",
]


def _by_role(run: Run) -> dict[str, tuple[int, int]]:
    """role -> (most requests running in one step, prefix-cache lookups in all steps)."""
    out: dict[str, tuple[int, int]] = {}
    for row in read_worker_metrics(run.run_dir).to_pylist():
        running, queries = out.get(row["role"], (0, 0))
        out[row["role"]] = (max(running, row["running"] or 0), queries + (row["prefix_cache_queries"] or 0))
    return out


@pytest.mark.e2e
def test_engine_kwargs_and_pool_shapes_reach_their_pools(tmp_path_factory, reference):
    shard = str(SAMPLE / SHARDS[0])
    runs = {  # name -> (run, TP by role)
        "push": (run_to_end(tmp_path_factory, "kwargs-push-tp-up", "pools=disaggregated", "transport=nixl_push",
                      "model.decode_tp=3", *KWARGS, input_url=shard), {"prefill": 1, "decode": 3}),
        "pull": (run_to_end(tmp_path_factory, "kwargs-pull-tp-down", "pools=disaggregated", "transport=nixl_pull",
                      "model.prefill_tp=3", *KWARGS, input_url=shard), {"prefill": 3, "decode": 1}),
    }

    # Checking the arguments imports vLLM in the launcher; the launcher still exits cleanly (its
    # submitit jobs were once kept alive by vLLM's import until shutdown, where their __del__ failed).
    for run, _ in runs.values():
        assert "Exception ignored" not in run.stderr, run.stderr[-2000:]

    for name, (run, tp) in runs.items():
        roles = _by_role(run)
        # Decode: its own max_num_seqs=2 over the shared 3; prefix caching off from the shared dict.
        assert roles["decode"] == (2, 0), (name, roles)
        # Prefill: its own enable_prefix_caching=true over the shared false.
        assert roles["prefill"][1] > 0, (name, roles)

        # Each pool ran at its own TP size: vLLM's config, and one model-worker process per rank.
        engines = run.engines()
        for role, n in tp.items():
            assert (engines[role]["tp"], engines[role]["worker_processes"]) == (n, n), (name, engines[role])
            assert engines[role]["block_size"] == BLOCK, (name, engines[role])

        # The arguments and shapes change the batches, not the results (greedy, float32).
        for shard_name in SHARDS:
            want, got = reference[shard_name], run.rows(shard_name)
            assert [r["id"] for r in got] == [r["id"] for r in want]
            for g, w in zip(got, want):
                assert g["error"] is None, (name, g["error"])
                assert g["prompt_tokens"] == len(w["prompt_ids"]), (name, g["id"])
                assert g["generation_token_ids"] == w["token_ids"][:MAX_NEW_TOKENS], (name, g["id"])
                assert g["prompt_tokens"] - 1 <= g["kv_tokens"] <= g["prompt_tokens"], (name, g)

        # The KV really moved between the shapes: the side that moves it (push: prefill WRITEs,
        # pull: decode READs) made one NIXL transfer per row and rank of the larger pool (each
        # TP-1 rank holds all 3 KV heads; each TP-3 rank one of them), and the bytes add up to
        # every prompt block's KV exactly once; the decode engine computed at most one prompt
        # token per row itself (vLLM's counters).
        steps = read_worker_metrics(run.run_dir).to_pylist()
        mover = "prefill" if name == "push" else "decode"
        moved = [b for s in steps if s["role"] == mover for b in (s["kv_transfer_bytes"] or ())]
        rows = read_request_metrics(run.run_dir).to_pylist()
        assert len(moved) == len(rows) * max(tp.values()), (name, len(moved))
        assert sum(moved) == sum(-(-r["prompt_tokens"] // BLOCK) * BLOCK * KV_BYTES_PER_TOKEN_FP32 for r in rows)
        computed = sum(s["prompt_tokens_computed"] or 0 for s in steps if s["role"] == "decode")
        assert computed <= len(rows), (name, computed)
