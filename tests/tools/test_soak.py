"""tools/soak.py's pure parts: the seeded fault schedule and its rules, the output check, and
the table and verdict from a canned result, and how it tells a process that ended from one
that outlived its worker (no Slurm, no engine; the soak itself is a tool run by hand or nightly)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tools.soak import (DECODE_OUT_S, DEFAULT_KINDS, KINDS, PERMANENT, attribute, check_output, plan, table,
                        verdict)

SEEDS = range(40)


def test_the_schedule_is_reproducible_from_the_seed():
    assert plan(7, 30) == plan(7, 30)
    assert plan(7, 30) != plan(8, 30)
    assert plan(7, 30, kinds=["lost", "cut"]) == plan(7, 30, kinds=["lost", "cut"])


@pytest.mark.parametrize("gaps", [(60, 120), (90, 90), (100, 200)])
def test_faults_come_within_the_gaps_and_the_minutes(gaps):
    lo, hi = gaps
    for seed in SEEDS:
        faults = plan(seed, 30, lo, hi)
        assert faults and [f["i"] for f in faults] == list(range(1, len(faults) + 1))
        at = [0.0] + [f["at_s"] for f in faults]
        assert all(lo - 0.1 <= b - a <= hi + 0.1 for a, b in zip(at, at[1:])), (seed, at)
        assert at[-1] <= 30 * 60
        assert 30 * 60 - at[-1] < hi + 0.1  # no room left for another


def test_only_the_kinds_asked_for():
    for kinds in (["lost"], ["cut", "preempt"], ["kill-prefill", "kill-decode", "cancel", "preempt"]):
        for seed in SEEDS:
            assert {f["kind"] for f in plan(seed, 30, kinds=kinds)} <= set(kinds)
    everything = Counter(f["kind"] for seed in SEEDS for f in plan(seed, 30))
    assert set(everything) == set(DEFAULT_KINDS.split(","))
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(1, 30, kinds=["lost", "reboot"])


@pytest.mark.parametrize("kinds", [DEFAULT_KINDS.split(","), list(KINDS), ["lost", "cut", "cancel", "kill-decode"]])
def test_never_two_decode_outages_at_once(kinds):
    """A fault that takes a decode rank out of service starts only once the one before has
    ended; a rank lost for good at most once (of two), in the last third."""
    for seed in SEEDS:
        faults = plan(seed, 30, kinds=kinds)
        out = [f for f in faults if f["decode_out"]]
        for a, b in zip(out, out[1:]):
            assert b["at_s"] >= a["at_s"] + DECODE_OUT_S[a["kind"]], (seed, a, b)
        permanent = [f for f in out if f["kind"] in PERMANENT]
        assert len(permanent) <= 1 and all(f["at_s"] >= 20 * 60 for f in permanent), (seed, permanent)
        assert all(f["decode_out"] == (f["kind"] in ("cut", *PERMANENT) or f["target"] in ("pd-node3", "pd-node4"))
                   for f in faults)


def test_each_prefill_task_killed_at_most_once_and_nodes_not_lost_twice_at_once():
    for seed in SEEDS:
        faults = plan(seed, 30)
        kills = Counter(f["target"] for f in faults if f["kind"] == "kill-prefill")
        assert all(n == 1 for n in kills.values()) and set(kills) <= {"prefill-0", "prefill-1"}
        lost = [f for f in faults if f["kind"] == "lost"]
        for a in lost:
            assert not [b for b in lost if b is not a and b["target"] == a["target"]
                        and a["at_s"] <= b["at_s"] < a["at_s"] + DECODE_OUT_S["lost"]], seed


def test_only_decode_kinds_wait_for_the_outage_to_end():
    """With nothing but decode outages asked for, a fault waits for the one before to end: the
    one case of a gap above the largest."""
    faults = plan(3, 30, kinds=["lost"])
    assert faults  # lost may hit prefill nodes too: gaps stay in bounds
    only_cut = plan(3, 30, kinds=["cut"])
    at = [f["at_s"] for f in only_cut]
    assert all(b - a >= DECODE_OUT_S["cut"] for a, b in zip(at, at[1:]))


def test_check_output_counts_missing_duplicated_errors_and_differences():
    ids = ["a", "b", "c", "d", "e"]
    ref = {"a": [1, 2], "b": [3], "c": [4], "d": [5], "e": [6]}
    rows = [{"id": "a", "generation_token_ids": [1, 2], "error": None},
            {"id": "b", "generation_token_ids": [3], "error": None},
            {"id": "b", "generation_token_ids": [3], "error": None},
            {"id": "c", "generation_token_ids": [9], "error": None},
            {"id": "d", "generation_token_ids": None, "error": "DecodeUnavailable: ..."},
            {"id": "z", "generation_token_ids": [0], "error": None}]
    c = check_output(ids, rows, ref)
    assert (c["missing"], c["duplicated"], c["extra"], c["errors"], c["differ"], c["compared"]) == (1, 1, 1, 1, 2, 1)
    assert c["examples"]["missing"] == ["e"] and c["examples"]["differ"] == ["c", "d"]
    assert check_output(["a"], rows[:1], ref)["compared"] == 1


def _result(**over):
    faults = [
        {"i": 1, "kind": "lost", "target": "pd-node4", "peer": None, "decode_out": True, "t": 150.0,
         "resolved": "lost pd-node4 for 60 s (decode rank 1)", "skipped": None},
        {"i": 2, "kind": "preempt", "target": "pd-node1", "peer": None, "decode_out": False, "t": 240.0,
         "resolved": None, "skipped": "no prefill task running on a prefill node"},
        {"i": 3, "kind": "cancel", "target": "decode-0", "peer": None, "decode_out": True, "t": None,
         "skipped": "not reached: the run had ended"},
    ]
    events = [
        {"t": 40.0, "what": "prefill task 0 pending -> running on pd-node1", "row": None},
        {"t": 171.0, "what": "decode rank 1 running -> pending", "row": None},
        {"t": 172.0, "what": "a prefill worker saw decode rank 1 dead, served its hand-offs again", "row": None},
        {"t": 172.0, "what": "", "row": "0:3"},
        {"t": 172.5, "what": "", "row": "0:4"},
        {"t": 173.0, "what": "a prefill worker saw decode rank 1 dead, served its hand-offs again", "row": None},
        {"t": 174.0, "what": "", "row": "0:3"},
        {"t": 245.0, "what": "decode rank 1 pending -> running on pd-node4", "row": None},
    ]
    result = {"rc": 0, "faults": faults, "events": events,
              "check": {"rows": 10, "compared": 10, "missing": 0, "duplicated": 0, "errors": 0, "differ": 0}}
    result.update(over)
    return result


def test_events_go_to_the_last_fault_before_them():
    r = _result()
    by = attribute(r["faults"], r["events"])
    assert [e["t"] for e in by[0]] == [40.0]
    assert len(by[1]) == 7 and set(by) == {0, 1}  # a fault not injected has none


def test_table_and_verdict_from_a_canned_result():
    text = table(_result())
    lines = text.splitlines()
    assert lines[0] == "| # | fault | when (s) | target | what the pipeline did | rows handed off again |"
    assert lines[1] == "|---:|---|---:|---|---|---:|"
    assert lines[2] == "| 0 | (none yet) | - | - | prefill task 0 pending -> running on pd-node1 | 0 |"
    assert lines[3] == ("| 1 | lost | 150 | lost pd-node4 for 60 s (decode rank 1) | decode rank 1 running -> pending; "
                        "a prefill worker saw decode rank 1 dead, served its hand-offs again (x2); "
                        "decode rank 1 pending -> running on pd-node4 | 2 |")
    assert lines[4] == ("| 2 | preempt | 240 | preempt pd-node1 | not injected: no prefill task running on a "
                        "prefill node | - |")
    assert lines[5] == "| 3 | cancel | - | cancel decode-0 | not injected: not reached: the run had ended | - |"
    passed, line = verdict(_result())
    assert passed and line == ("verdict: PASS: 10 input rows, 10 in the output once and equal to the colocated run; "
                               "1 faults injected, 2 skipped")
    passed, line = verdict(_result(rc=1, check={"rows": 10, "compared": 7, "missing": 1, "duplicated": 1,
                                                "errors": 0, "differ": 1}))
    assert not passed and line.startswith("verdict: FAIL: 10 input rows, 7 in the output once")
    assert line.endswith("; the launcher exited 1; 1 rows missing; 1 rows more than once; "
                         "1 rows differ from the colocated run")


def test_a_rows_text_depends_on_its_index_alone(tmp_path, monkeypatch):
    """So a reference over rows 0-9 and one over rows 6-9 agree, and no two rows are the same
    (two short documents stand in for the standard library's docstrings: parsing them all takes
    seconds)."""
    import pyarrow.parquet as pq

    from tools import soak
    from tools.soak import write_inputs

    monkeypatch.setattr(soak, "_docs", lambda: [("a", "a1\n\na2"), ("b", "b1\n\nb2\n\nb3")])

    ids = write_inputs(tmp_path / "all", 10, 3)
    assert ids == [f"soak-{i:06d}" for i in range(10)]
    assert [pq.read_table(p).num_rows for p in sorted((tmp_path / "all").glob("*.parquet"))] == [4, 3, 3]
    assert write_inputs(tmp_path / "tail", 4, 1, start=6) == ids[6:]

    def texts(folder):
        return {r["id"]: r["text"] for p in sorted(folder.glob("*.parquet")) for r in pq.read_table(p).to_pylist()}

    every, tail = texts(tmp_path / "all"), texts(tmp_path / "tail")
    assert tail == {i: every[i] for i in ids[6:]}
    assert len(set(every.values())) == 10
    assert every["soak-000003"] == "Note 2 on the b module.\n\nb2\n\nb3\n\nb1"  # b, rotated by one


def test_a_process_that_ended_is_gone_even_while_its_parent_has_not_reaped_it():
    """The soak reports engine processes that outlive their killed worker; one that has ended (a
    zombie, not yet reaped) or is still being killed must not count as outliving it."""
    import signal
    import subprocess
    import time

    from tools.soak import process_state

    p = subprocess.Popen(["sleep", "60"])
    try:
        assert process_state(p.pid) == "running"
        p.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_state(p.pid) != "gone":  # a zombie: /proc/PID is still there until the wait
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert Path(f"/proc/{p.pid}").exists()
    finally:
        p.kill()
        p.wait()
    assert process_state(p.pid) == "gone"
