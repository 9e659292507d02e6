"""tools/bench_claims.py's figures from a run directory's records, worked out by hand."""

from __future__ import annotations

import json

from tools.bench_claims import measure, skewed_input


def test_makespan_and_first_finisher_idle_from_the_records(tmp_path):
    (tmp_path / "engines").mkdir()
    (tmp_path / "done" / "sub").mkdir(parents=True)
    for w, ready in (("colocated-0@h", 100.0), ("colocated-1@h", 101.0)):
        (tmp_path / "engines" / f"{w}.json").write_text(json.dumps({"worker": w, "ready_at": ready}))
    for name, w, end, rows in (("a", "colocated-0@h", 150.0, 24), ("b", "colocated-1@h", 130.0, 4),
                               ("sub/c", "colocated-1@h", 140.0, 4)):
        (tmp_path / "done" / f"{name}.json").write_text(json.dumps({"worker": w, "finished_at": end, "rows": rows}))
    # A split shard, assembled by colocated-0: its parts count for the workers that served them.
    (tmp_path / "done" / "d.json").write_text(json.dumps({
        "worker": "colocated-0@h", "finished_at": 146.0, "rows": 10,
        "parts": [{"worker": "colocated-1@h", "rows": 6, "finished_at": 145.0},
                  {"worker": "colocated-0@h", "rows": 4, "finished_at": 146.0}]}))
    m = measure(tmp_path)
    assert m["makespan_s"] == 50.0  # 100 (first ready) to 150 (last done)
    assert m["idle_share"] == 5.0 / 50.0  # colocated-1's last part done at 145
    assert m["rows"] == {"colocated-0": 28, "colocated-1": 14}


def test_skewed_input_has_the_sizes_asked_for(tmp_path):
    import pyarrow.parquet as pq

    assert skewed_input(tmp_path / "in", 7, [2, 3]) == [7, 2, 3]
    files = sorted((tmp_path / "in").glob("*.parquet"))
    assert [pq.read_table(f).num_rows for f in files] == [7, 2, 3]
    assert pq.read_table(files[0]).column("id").to_pylist()[0] == "s0r0"
