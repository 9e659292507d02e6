"""Elastic pools (issue #40, part 1: decode ranks take work when prefill runs short), on real
engines and NIXL.

A 1P:1D push run with ``pools.elastic=true`` over the sample split into six units of 4 rows
(``job.unit_rows=4``), whose prefill worker claims its first unit and then comes up 10 s late
(``PD_PIPELINE_INJECT_PREFILL_START_DELAY_S``, on top of its engine's start): its pool runs
short. The decode rank, idle with no hand-off, claims the other units and serves them in its own
engine; the prefill worker, once up, serves its unit by hand-offs and finds nothing left.

Checked against what the output and the run directory say independently of the pipeline's
report: every row once and, row for row, the colocated run's greedy tokens (float32); the rows
of the first unit (the first 4 of the first shard) prefilled on the prefill worker with their
KV moved to the decode rank (``kv_tokens``: all of the prompt but at most its last token), every
other row served by the decode rank alone (``prefill_worker`` names it, no KV moved); the claim
files name the decode rank for units 1-5.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline.runtime.claims import holders
from tests.helpers import COMMON, SAMPLE, run_pipeline

SHARDS = ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


@pytest.mark.e2e
def test_an_idle_decode_rank_takes_units_and_serves_them_colocated(tmp_path, colocated_run):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    p = run_pipeline(*COMMON, f"job.input={SAMPLE}", f"job.output={out}", f"run.dir={run_dir}",
                     "pools=disaggregated", "transport=nixl_push", "pools.elastic=true", "pools.elastic_idle_s=0.5",
                     "job.unit_rows=4", env={"PD_PIPELINE_INJECT_PREFILL_START_DELAY_S": "10"})
    assert p.returncode == 0, p.stderr[-4000:]
    assert "rows 24: 24 generated, 0 errors" in p.stdout, p.stdout

    served = {}
    for shard in SHARDS:
        got, want = pq.read_table(out / shard).to_pylist(), colocated_run.rows(shard)
        assert [r["id"] for r in got] == [r["id"] for r in want]
        for g, w in zip(got, want):
            assert g["error"] is None, g["error"]
            assert g["generation_token_ids"] == w["generation_token_ids"], g["id"]
            served[(shard, g["id"])] = g
    rows = list(served.values())
    first_unit = rows[:4]  # unit 0: the first shard's first row group
    for r in first_unit:
        assert r["prefill_worker"].startswith("prefill-0@") and r["decode_worker"].startswith("decode-0@"), r
        assert r["prompt_tokens"] - 1 <= r["kv_tokens"] <= r["prompt_tokens"], r
    for r in rows[4:]:
        assert r["prefill_worker"].startswith("decode-0@") and r["decode_worker"] is None, r
        assert not r["kv_tokens"], r
    # The run's summary says how many rows went each way (counted here from the output).
    by_decode = sum(r["prefill_worker"].startswith("decode-") for r in rows)
    assert by_decode == 20
    assert (f"pools.elastic: decode ranks served {by_decode} of the 24 rows on their own (prefill and decode, no "
            f"hand-off); prefill workers the other {24 - by_decode}") in p.stdout, p.stdout
    held = holders(run_dir)
    assert {i: w for i, (_, w) in held.items() if i < 6} == {0: "prefill-0", **{i: "decode-0" for i in range(1, 6)}}, held
