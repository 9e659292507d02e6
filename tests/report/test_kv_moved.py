"""Did the KV move, as a run reports it: ``decode_kv`` in report.json (from the request metrics of
a synthetic run), in the done markers (a shard owner's totals) and in summary.json and the
summary printed at the end (summed done markers), with the line that says so. Every expected
number is worked out by hand in the comments."""

from __future__ import annotations

import json
from types import SimpleNamespace

from pipeline.io.output import RowResult
from pipeline.report.summary import summarize_run
from pipeline.report.text import kv_text, summary_text
from pipeline.roles.shard_owner import ShardOwner
from pipeline.run import summarize
from pipeline.runtime.rundir import RunDir
from tests.report.synthetic import REQUESTS, make_run, req

# REQUESTS: 3 handed-off rows of 100 prompt tokens whose kv_tokens are 100 (0 computed), one
# prefill error (no decode worker). Here: one more whose KV arrived (99: the last token computed),
# one recomputed (kv 0: 100 computed), one prefilled on decode on purpose (no prefill_end, 40
# tokens), one row failed by transport.on_recompute=fail (30 of 50 computed).
FAIL = "decode recomputed 30 of 50 prompt tokens (the KV did not arrive); transport.on_recompute=fail"
EXTRA = [
    {**req("0:4", 0.0, 0.1, 0.2, [0.3, 0.31]), "kv_tokens": 99},
    {**req("0:5", 0.0, 0.1, 0.2, [0.3, 0.31]), "kv_tokens": 0},
    {**req("0:6", 0.0, 0.1, None, [0.3, 0.31], prompt=40), "decode_worker": "decode-0@h", "kv_tokens": 0},
    {**req("0:7", 0.0, 0.1, 0.2, [], error=FAIL, prompt=50), "kv_tokens": 20},
]
COUNTS = {"rows": 6,  # 3 + 0:4 + 0:5 + 0:7
          "kv_loaded_rows": 4,  # 3 + 0:4
          "recomputed_rows": 2,  # 0:5, 0:7
          "prompt_tokens": 3 * 100 + 100 + 100 + 50,  # 550
          "computed_tokens": 0 + 1 + 100 + 30,  # 131
          "recomputed_tokens": 100 + 30,  # 130
          "local_rows": 1, "local_tokens": 40}
LINE = ("KV: decode loaded the KV of 4 of 6 rows handed off, and computed 131 of their 550 prompt tokens (at "
        "most 1 a row when its KV arrived) | 1 rows prefilled on decode on purpose (pools.local_prefill_tokens): 40 "
        "prompt tokens | warning: decode recomputed the prompt of 2 of 6 rows (130 prompt tokens): their KV did "
        "not arrive (transport.on_recompute)")


def test_report_counts_what_decode_computed(tmp_path):
    rep = summarize_run(make_run(tmp_path, REQUESTS + EXTRA))
    assert rep["decode_kv"] == COUNTS
    assert LINE in summary_text(rep).splitlines()


def test_a_run_whose_kv_moved_says_so_without_a_warning(tmp_path):
    rep = summarize_run(make_run(tmp_path, REQUESTS))
    assert rep["decode_kv"] == {**dict.fromkeys(COUNTS, 0), "rows": 3, "kv_loaded_rows": 3, "prompt_tokens": 300}
    assert ("KV: decode loaded the KV of 3 of 3 rows handed off, and computed 0 of their 300 prompt tokens (at "
            "most 1 a row when its KV arrived)") in summary_text(rep).splitlines()
    assert "warning" not in summary_text(rep)


def test_a_colocated_run_has_no_kv_line(tmp_path):
    colocated = [req("0:0", 0.0, 0.1, None, [0.3, 0.31]), req("0:1", 0.0, 0.1, None, [0.3, 0.4])]
    rep = summarize_run(make_run(tmp_path, colocated))
    assert rep["decode_kv"] == dict.fromkeys(COUNTS, 0)
    assert kv_text(rep["decode_kv"]) is None and "KV: " not in summary_text(rep)
    assert kv_text(None) is None  # a summary.json written before these counts


def _row(decode_worker, error, prompt, kv, handoff_s) -> RowResult:
    return RowResult(decode_worker=decode_worker, error=error, prompt_tokens=prompt, kv_tokens=kv,
                     kv_handoff_s=handoff_s)


def test_done_markers_and_the_summary_printed_at_the_end(tmp_path):
    # A shard owner's totals over its output rows (an output row was handed off with its KV when
    # kv_handoff_s is not null), in two batches, as two shards' done markers.
    first = SimpleNamespace(worker="prefill-0@h", totals={"rows": 0, "errors": 0, "prompt_tokens": 0,
                                                          "output_tokens": 0, "kv_bytes": 0, "decode_rank_rows": 0,
                                                          "prefill_local_rows": 0,
                                                          "decode_kv": dict.fromkeys(COUNTS, 0)})
    ShardOwner._count(first, [_row("decode-0@h", None, 100, 99, 0.1), _row("decode-0@h", None, 100, 0, 0.1)])
    ShardOwner._count(first, [_row("decode-0@h", None, 40, 0, None), _row(None, "text is null", None, 0, None)])
    # 2 handed off: 1 + 100 computed, the second recomputed; one of 40 tokens prefilled on decode.
    assert first.totals["decode_kv"] == {**dict.fromkeys(COUNTS, 0), "rows": 2, "kv_loaded_rows": 1,
                                         "recomputed_rows": 1, "prompt_tokens": 200, "computed_tokens": 101,
                                         "recomputed_tokens": 100, "local_rows": 1, "local_tokens": 40}
    second = SimpleNamespace(worker="prefill-1@h", totals={**first.totals, "decode_kv": dict.fromkeys(COUNTS, 0)})
    ShardOwner._count(second, [_row("decode-1@h", FAIL, 50, 20, None)])  # 30 computed, an error row
    # A row an elastic prefill worker served alone (pools.elastic): counted apart, no KV moved.
    ShardOwner._count(second, [_row(None, None, 30, None, None)])
    assert second.totals["prefill_local_rows"] == 1
    # An elastic decode rank's unit (pools.elastic): its rows served colocated, no decode worker,
    # counted apart and not as KV that moved.
    third = SimpleNamespace(worker="decode-0@h", totals={**dict.fromkeys(first.totals, 0), "decode_kv": dict.fromkeys(COUNTS, 0)})
    ShardOwner._count(third, [_row(None, None, 60, None, None), _row(None, None, 70, None, None)])
    assert third.totals["decode_rank_rows"] == 2 and third.totals["decode_kv"] == dict.fromkeys(COUNTS, 0)
    done = tmp_path / "done"
    done.mkdir()
    for name, owner in (("a.parquet", first), ("b.parquet", second), ("c.parquet", third)):
        (done / f"{name}.json").write_text(json.dumps({"shard": name, **owner.totals, "resumed_rows": 0}))
    s = summarize(RunDir(tmp_path), "out", 3, 10.0)
    want = {**dict.fromkeys(COUNTS, 0), "rows": 3, "kv_loaded_rows": 1, "recomputed_rows": 2, "prompt_tokens": 250,
            "computed_tokens": 131, "recomputed_tokens": 130, "local_rows": 1, "local_tokens": 40}
    assert s.decode_kv == want
    assert json.loads((tmp_path / "summary.json").read_text())["decode_kv"] == want
    assert ("\nKV: decode loaded the KV of 1 of 3 rows handed off, and computed 131 of their 250 prompt tokens "
            "(at most 1 a row when its KV arrived) | 1 rows prefilled on decode on purpose "
            "(pools.local_prefill_tokens): 40 prompt tokens | warning: decode recomputed the prompt of 2 of 3 rows "
            "(130 prompt tokens): their KV did not arrive (transport.on_recompute)\n") in s.text() + "\n"
    # Rows by hand: a 4, b 6 (its totals began as a's 4, plus 2), c 2, of which c's 2 by decode-0
    # and 1 of b's by prefill-1 alone.
    assert (s.rows, s.decode_rank_rows, s.prefill_local_rows) == (12, 2, 1)
    assert ("\npools.elastic: of the 12 rows, decode ranks served 2 on their own and prefill workers 1 (prefill and "
            "decode in one engine, no hand-off); the other 9 went through prefill workers (handed off, or error "
            "rows)") in s.text()
