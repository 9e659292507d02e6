"""tools/bench_scale.py engines: its inputs, figures and tables worked out by hand (no engine)."""

from __future__ import annotations

import pytest

from tools.bench_parts import scale_engines as se


def test_one_line_rows_are_docstring_first_lines_distinct_then_numbered():
    src = '"""Module line one.\n\nMore."""\n\ndef f():\n    """Short."""\n\nclass C:\n    """A class that does things.\n    """\n'
    assert se.docstring_first_lines(src, min_chars=10) == ["Module line one.", "A class that does things."]
    assert se.one_line_texts(5, pool=["a", "b"]) == ["a", "b", "2. a", "2. b", "3. a"]


def test_rows_keep_their_ids_whatever_the_sharding(tmp_path):
    import pyarrow.parquet as pq

    assert se.split_rows(7, 3) == [3, 2, 2]
    with pytest.raises(ValueError):
        se.split_rows(2, 3)
    texts = [f"t{i}" for i in range(7)]
    ids = {}
    for shards in (1, 3):
        wl = se.write_rows(tmp_path / str(shards), texts, shards)
        files = sorted((tmp_path / str(shards)).glob("part-*.parquet"))
        assert len(files) == shards and wl["rows"] == 7
        ids[shards] = [(i, t) for f in files for i, t in zip(*pq.read_table(f).to_pydict().values())]
    assert ids[1] == ids[3] and ids[1][6] == ("row0000006", "t6")


def test_cpu_outside_the_engine_tokens_and_memory():
    cores = {"launcher": 0.1, "colocated-0 front-end": 0.3, "colocated-0 engine core": 0.05,
             "colocated-0 model worker": 1.5, "other": 0.1}
    s = se.cpu_split(cores, 10.0)
    assert s["engine_cpu_s"] == pytest.approx(15.5) and s["outside_engine_cpu_s"] == pytest.approx(5.0)

    raw = {"a": [5, [1, 2]], "b": [6, [3]], "c": [7, [4]]}
    pipe = {"a": [5, [1, 2]], "b": [6, [9]], "d": [1, [1]]}
    c = se.compare_tokens(raw, pipe)
    assert c == {"rows": 3, "same": 1, "missing": 2, "prompt_differs": 0, "first_differing": [["b", [3], [9]]]}
    assert se.same_text(c) == "NO (1/3, 2 missing)" and se.same_text(se.compare_tokens(raw, raw)) == "yes"

    labels = {1: "launcher", 2: "other", 3: "colocated-0 front-end", 4: "colocated-0 engine core",
              5: "colocated-0 model worker"}
    m = se.peak_rss_mib({1: 102400, 2: 2048, 3: 819200, 4: 409600, 5: 2048000}, labels, root=1)
    assert m == {"launcher": 100.0, "worker": 800.0, "engine": 2000.0}


def _point(kind, rows, process_s, wall_s, outside_window, outside_process, shards=2):
    return {"kind": kind, "rows": rows, "outputs": 1, "shards": None if kind == "raw" else shards,
            "process_s": process_s, "wall_s": wall_s, "cpu": {"other_load_cores": 0.0},
            "window_cpu": {"outside_engine_cpu_s": outside_window},
            "process_cpu": {"outside_engine_cpu_s": outside_process}}


def test_ratios_own_cpu_per_row_and_the_tables():
    raw = _point("raw", 100, 40.0, 10.0, 0.5, 8.0)
    col = _point("coloc", 100, 50.0, 12.5, 1.5, 18.0)
    col["raw_ref"] = {"process_s": 40.0, "wall_s": 10.0, "outside_engine_cpu_s": 0.5,
                      "process_outside_engine_cpu_s": 8.0}
    col.update({"peak_rss_mib": {"launcher": 100.0, "worker": 800.0, "engine": 2000.0}, "run_dir_files": 25,
                "run_dir_bytes": 2**20, "same_tokens": {"rows": 100, "same": 100, "missing": 0},
                "status": {"wall_s": 0.3, "rc": 0}, "report": {"wall_s": 1.2, "peak_rss_mib": 150.0, "rc": 0},
                "rerun": {"wall_s": 0.6, "rc": 0, "nothing_to_do": True}})
    d = se.derived(col)
    assert d["ratio_process"] == pytest.approx(0.8) and d["ratio_window"] == pytest.approx(0.8)
    assert d["own_ms_per_row_window"] == pytest.approx(10.0)  # (1.5 - 0.5) s over 100 rows
    assert d["own_ms_per_row_process"] == pytest.approx(100.0)
    text = se.tables([raw, col, {"kind": "pd", "rows": 100, "outputs": 1, "shards": 2, "error": "RunError: x"}])
    assert "| 100 | 1 | - | raw vLLM | 40.0 | 10.0 | 2.5 | 10.0 | | | 5.00 | 80.00 | | | 0.00 |" in text
    assert "| 100 | 1 | 2 | colocated | 50.0 | 12.5 | 2.0 | 8.0 | 0.80x | 0.80x | 15.00 | 180.00 | 10.00 | yes |" in text
    assert "| 100 | 1 | 2 | colocated | 100 | 800 | 2000 | 25 | 1.00 | 0.30 | 1.20 | 150 | 0.60 |" in text
    assert "- pd rows 100 out 1 shards 2: RunError: x" in text
    big = _point("coloc", 1100, 60.0, 22.5, 2.5, 28.0)
    assert "| coloc | 1 | 2 | 100->1100 | 10.00 | 10.00 | 10.00 |" in se.marginal([col, big])
