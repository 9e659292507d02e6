"""Elastic pools (issue #40: roles as preferences), on real engines and NIXL.

A 1P:1D push run with ``pools.elastic=true``, ``pools.elastic_prefer=handoff`` (hand-offs first,
the rule for a prefill pool faster than its decode ranks; the default, ``local``, runs in the
fault test below and, without engines, in tests/roles/test_elastic_prefer.py) and
``pools.elastic_decode_rows=1`` (a decode rank
decoding one row is full) over the sample split into six units of 4 rows (``job.unit_rows=4``),
whose prefill worker claims its first unit and then comes up 10 s late
(``PD_PIPELINE_INJECT_PREFILL_START_DELAY_S``, on top of its engine's start): its pool runs
short. The decode rank, not full, claims units one at a time and serves them in its own engine.
The prefill worker, once up, serves a row alone whenever the decode rank is full (serving a
unit, or one hand-off; ``pools.elastic_wait_s=0``: at once), and hands it off otherwise. Which units each side gets depends on the
two engines' speeds; what must hold does not.

Checked against what the output and the run directory say independently of the pipeline's
report: every row once and, row for row, the colocated run's greedy tokens (float32); each
unit's rows served by the worker its claim file names: the decode rank alone
(``prefill_worker`` names it, no KV moved), or the prefill worker by hand-off (``kv_tokens``: all
of the prompt but at most its last token) or alone (``decode_worker`` null, no KV); the decode
rank took a unit and the prefill worker served rows alone; the summary line's counts are those
of the output.
"""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from pipeline.runtime.claims import holders
from pipeline.runtime.rundir import RunDir
from pipeline.status import status_text
from tests.helpers import COMMON, SAMPLE, run_pipeline

SHARDS = ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


@pytest.mark.e2e
def test_pools_rebalance_decode_takes_units_and_prefill_serves_rows_when_decode_is_full(tmp_path, colocated_run):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    p = run_pipeline(*COMMON, f"job.input={SAMPLE}", f"job.output={out}", f"run.dir={run_dir}",
                     "pools=disaggregated", "transport=nixl_push", "pools.elastic=true", "pools.elastic_prefer=handoff", "pools.elastic_idle_s=0.5",
                     "pools.elastic_wait_s=0", "pools.elastic_decode_rows=1", "job.unit_rows=4",
                     env={"PD_PIPELINE_INJECT_PREFILL_START_DELAY_S": "10"})
    assert p.returncode == 0, p.stderr[-4000:]
    assert "rows 24: 24 generated, 0 errors" in p.stdout, p.stdout

    rows = _rows_as_colocated(out, colocated_run)
    # Each unit's 4 rows (in input order: the shards' row groups) were served by the worker
    # holding its claim: the decode rank alone, or the prefill worker, by hand-off (its KV moved
    # to the decode rank) or alone (the decode rank full).
    held = holders(run_dir)
    _report_and_status_agree(run_dir, rows)
    alone = by_decode = 0
    for unit in range(6):
        holder = held[unit][1]
        for r in rows[4 * unit:4 * unit + 4]:
            assert r["prefill_worker"].split("@")[0] == holder, (unit, held, r)
            if holder == "decode-0" or r["decode_worker"] is None:  # served in one engine
                assert r["decode_worker"] is None and not r["kv_tokens"], r
                alone += holder == "prefill-0"
                by_decode += holder == "decode-0"
            else:
                assert r["decode_worker"].startswith("decode-0@"), r
                assert r["prompt_tokens"] - 1 <= r["kv_tokens"] <= r["prompt_tokens"], r
    assert held[0][1] == "prefill-0", held  # claimed before its engine started
    # The decode rank, up 10 s before the prefill worker, took at least one unit. The prefill
    # worker served at least 3 rows alone: its first rows were decided while the decode rank
    # served a unit (full: all of them), or while the first hand-off was in prefill (full: the
    # next 3).
    assert by_decode >= 4 and alone >= 3, (by_decode, alone)
    # The run's summary says how many rows went each way (counted here from the output).
    assert (f"pools.elastic: of the 24 rows, decode ranks served {by_decode} on their own and prefill workers "
            f"{alone} (prefill and decode in one engine, no hand-off); the other {24 - by_decode - alone} went "
            f"through prefill workers") in p.stdout, p.stdout


@pytest.mark.e2e
def test_a_decode_rank_lost_with_its_units_leaves_them_to_a_prefill_worker(tmp_path, colocated_run):
    """Faults (issue #40): the decode rank claims units while the prefill worker comes up 10 s
    late, and is killed (SIGKILL, ``PD_PIPELINE_INJECT_DECODE_KILL_AFTER_ROWS=2``) once it has
    served 2 rows of them: a decode rank lost while it serves claimed units, the run's only one.
    The prefill worker (``pools.elastic_prefer=local``, the default) serves rows alone and ends when nothing is left to
    claim but the lost rank's units, whose claims still look alive; once they do not
    (``pools.claim_dead_after_s=15``; 60 by default), the
    launcher starts array task 0 again, which takes them over and serves them alone. Checked:
    exit status 0, every row once and equal to the colocated run (float32), every row of the
    lost rank's units served in one engine by it or by the prefill worker, the claims of those
    units now the prefill worker's, and the launcher's warnings."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    p = run_pipeline(*COMMON, f"job.input={SAMPLE}", f"job.output={out}", f"run.dir={run_dir}",
                     "pools=disaggregated", "transport=nixl_push", "pools.elastic=true", "pools.elastic_idle_s=0.5", "pools.elastic_wait_s=0",
                     "job.unit_rows=4", "transport.decode_dead_after_s=5", "pools.claim_dead_after_s=15",
                     env={"PD_PIPELINE_INJECT_PREFILL_START_DELAY_S": "10",
                          "PD_PIPELINE_INJECT_DECODE_KILL_AFTER_ROWS": "2"})
    assert p.returncode == 0, p.stderr[-4000:]
    assert "rows 24: 24 generated, 0 errors" in p.stdout, p.stdout
    assert "array task 0 started again as job" in p.stderr and "to take them over" in p.stderr, p.stderr[-3000:]

    rows = _rows_as_colocated(out, colocated_run)
    held = holders(run_dir)
    lost = [u for u in range(6) if any(r["prefill_worker"].startswith("decode-0@") for r in rows[4 * u:4 * u + 4])]
    taken_over = [u for u in range(6) if held[u][0] > 0]  # claimed again after their holder was lost
    assert held[0][1] == "prefill-0" and taken_over, held
    for u in taken_over:  # the lost rank's units: each row served alone, by it (before it died) or prefill-0
        assert held[u][1] == "prefill-0", held
        for r in rows[4 * u:4 * u + 4]:
            assert r["decode_worker"] is None and not r["kv_tokens"], r
            assert r["prefill_worker"].split("@")[0] in ("decode-0", "prefill-0"), r
    assert set(lost) <= set(taken_over), (lost, taken_over)
    # The decode rank served at most the 2 rows it was killed after (1 of them may be in a checkpoint).
    assert sum(r["prefill_worker"].startswith("decode-0@") for r in rows) <= 2


def _rows_as_colocated(out, colocated_run) -> list[dict]:
    """The output rows, shard after shard, each checked once and equal (greedy token ids, no
    error) to the colocated run's row."""
    rows = []
    for shard in SHARDS:
        got, want = pq.read_table(out / shard).to_pylist(), colocated_run.rows(shard)
        assert [r["id"] for r in got] == [r["id"] for r in want]
        for g, w in zip(got, want):
            assert g["error"] is None, g["error"]
            assert g["generation_token_ids"] == w["generation_token_ids"], g["id"]
        rows += got
    return rows


def _report_and_status_agree(run_dir, rows: list[dict]) -> None:
    """The run's report (``rows_by_worker``, ``pools.png``) and ``status`` say, per worker, the
    rows it handed off and those it served alone, as counted here from the output."""
    want: dict[str, dict[str, int]] = {}
    for r in rows:
        d = want.setdefault(r["prefill_worker"], {"handed_off": 0, "alone": 0, "errors": 0})
        d["handed_off" if r["decode_worker"] else "alone"] += 1
    rep = json.loads((run_dir / "report" / "report.json").read_text())
    assert rep["rows_by_worker"] == want
    assert (run_dir / "report" / "pools.png").read_bytes()[:4] == b"\x89PNG"
    text = status_text(RunDir(run_dir))
    for w, d in want.items():
        line = f"  {w}: {d['handed_off'] + d['alone']} rows"
        line += (" (its own units, served alone)" if w.startswith("decode-")
                 else f" ({d['handed_off']} handed off, {d['alone']} served alone)")
        assert re.search(re.escape(line) + ",", text), text
