"""vLLM engine arguments reach the engines they are meant for, on real engines and real NIXL.

Two short runs of one shard of the sample (8 rows, all in flight at once) with the same settings: model.engine_kwargs for every engine
(max_num_seqs=3, prefix caching off), model.decode_engine_kwargs.max_num_seqs=2 and
model.prefill_engine_kwargs.enable_prefix_caching=true for their pools. What each engine ran with
is read from its per-step metrics (pipeline.io.metrics.read_worker_metrics): the most requests
it ran at once (``running``) and its prefix-cache lookups (``prefix_cache_queries``: 0 with
prefix caching off; thousands on this data with it on, as every default run shows).
"""

from __future__ import annotations

import pytest

from pipeline.io.metrics import read_worker_metrics
from tests.conftest import SAMPLE, Run, _run

SHARDS = ["part-00000.parquet"]
KWARGS = [
    "job.sampling.max_new_tokens=16", "model.seed=1234",
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
def test_engine_kwargs_reach_their_pools(tmp_path_factory):
    shard = str(SAMPLE / SHARDS[0])
    colocated = _run(tmp_path_factory, "kwargs-colocated", "pools=colocated", *KWARGS, input_url=shard)
    disagg = _run(tmp_path_factory, "kwargs-disagg", "pools=disaggregated", "transport=nixl_push", *KWARGS,
                  input_url=shard)

    # Checking the arguments imports vLLM in the launcher; the launcher still exits cleanly (its
    # submitit jobs were once kept alive by vLLM's import until shutdown, where their __del__ failed).
    for run in (colocated, disagg):
        assert "Exception ignored" not in run.stderr, run.stderr[-2000:]

    # Colocated engines take model.engine_kwargs only: 3 at once (the shard's 8 rows are in
    # flight), prefix caching off; neither pool's own dict reached them.
    assert _by_role(colocated) == {"colocated": (3, 0)}, _by_role(colocated)
    roles = _by_role(disagg)
    # Decode: its own max_num_seqs=2 over the shared 3; prefix caching off from the shared dict.
    assert roles["decode"] == (2, 0), roles
    # Prefill: its own enable_prefix_caching=true over the shared false.
    assert roles["prefill"][1] > 0, roles

    # The arguments change the batches, not the results (greedy, float32).
    for shard in SHARDS:
        want, got = colocated.rows(shard), disagg.rows(shard)
        assert [r["id"] for r in got] == [r["id"] for r in want]
        for g, w in zip(got, want):
            assert g["error"] is None and w["error"] is None, (g["error"], w["error"])
            assert g["generation_token_ids"] == w["generation_token_ids"], g["id"]
            assert g["kv_tokens"] and g["kv_tokens"] > 0, g  # the decode worker got its KV over NIXL
