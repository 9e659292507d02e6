"""The failing cases of ../shared/cases that need an engine, each with more members of its family,
in ONE colocated run over one input tree (one engine start):

- 01 a string column holding bytes that are not UTF-8 -> that row's error, never the shard's;
  also a large_string column, and ids of a nested type (keys by their JSON text);
- 02 shards with the same base name in different folders (hive partitions) -> two outputs at
  the same relative paths, the partition key kept; also a name with spaces and `=`, and one so
  long that a suffix would overflow the 255-byte name limit;
- 08 `job.too_long=truncate` leaves room for `job.sampling.max_new_tokens`;
- shards with different schemas read back as one dataset (`submit(...).result()`'s reader);
- JSON Lines and CSV shards beside the Parquet ones (same text column), each with lines that
  cannot become rows (not JSON, not UTF-8, a CSV record with too many fields): those lines are
  error rows that say which line and why, the others are served; the output is Parquet.

Expected values come from the case table (../shared/cases/README.md) and hand counts, not from
the pipeline's own output.
"""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io.shards import read_output
from pipeline.runtime.rundir import RunDir
from tests.helpers import COMMON, ROOT, run_pipeline

CASES = ROOT.parent / "shared" / "cases"
MAX_LEN, NEW = 512, 16
LONG_NAME = "n" * 243 + ".parquet"  # 251 bytes: + ".json" (a done marker) would be 256
ODD_NAME = "notes = draft v2.parquet"


@pytest.fixture(scope="module")
def cases_run(tmp_path_factory):
    if not CASES.is_dir():
        pytest.skip("../shared/cases is not here")
    base = tmp_path_factory.mktemp("cases")
    inp = base / "input"
    shutil.copytree(CASES / "02-same-basename-in-subfolders" / "input", inp)
    (inp / "utf8").mkdir()
    shutil.copy(CASES / "01-invalid-utf8-string-column" / "input" / "docs.parquet", inp / "utf8" / "docs.parquet")
    (inp / "long").mkdir()
    shutil.copy(CASES / "08-truncate-leaves-no-room" / "input" / "mixed.parquet", inp / "long" / "mixed.parquet")
    # More of family 01: a large_string text column with a bad row, and nested ids with a duplicate.
    raw = pa.array([b"Plain words about rivers.", b"\xc3\x28 broken", b"Words again."], pa.large_binary())
    text = pa.Array.from_buffers(pa.large_string(), len(raw), raw.buffers())  # unchecked, as a writer might
    pq.write_table(pa.table({"id": pa.array([{"doc": 1}, {"doc": 2}, {"doc": 1}]), "text": text}),
                   inp / "utf8" / "large.parquet")
    # More of family 02: a name with spaces and "=", and a very long one.
    for name in (ODD_NAME, LONG_NAME):
        pq.write_table(pa.table({"id": [name[:5]], "text": ["A short note about tea."]}), inp / name)
    # JSON Lines and CSV shards (the same text column), each with bad lines among good ones.
    (inp / "text").mkdir()
    (inp / "text" / "notes.jsonl").write_bytes(b"".join([
        b'{"id": "j1", "text": "A note about bread.", "score": 1}\n', b"\n", b"{not json\n",
        b'{"id": "j3", "text": "caf\xe9 au lait"}\n', b'["an", "array"]\n',
        b'{"id": "j5", "text": "A note about cheese.", "score": 2.5}\n']))
    (inp / "text" / "table.csv").write_bytes(
        b'id,text,score\nc1,"A note, with a comma, about tea.",3\nc2,too,many,fields\n'
        b'c3,"A note about\ncoffee over two lines.",4\n')
    # Named like the run directory's own files (issue #30), beside the hive folders' part-0.parquet:
    # a Spark-style folder of part files, a folder named like a JSON file, a JSON Lines shard
    # named like a decode worker's record.
    for name, ids in (("data.parquet/part-00000.parquet", ["sp-1", "sp-2"]), ("events.json/part-0.parquet", ["ev-1"])):
        (inp / name).parent.mkdir()
        pq.write_table(pa.table({"id": ids, "text": [f"A note about {i}." for i in ids]}), inp / name)
    (inp / "rank-0.json").write_text('{"id": "r0", "text": "A note about fog."}\n')
    out = base / "output"
    args = [*COMMON, "pools=colocated", f"run.dir={base / 'run'}", f"job.input={inp}", f"job.output={out}",
            f"model.max_model_len={MAX_LEN}", "job.too_long=truncate", f"job.sampling.max_new_tokens={NEW}"]
    p = run_pipeline(*args)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr[-4000:]}"
    return inp, out, base / "run", args


def _parquet(root) -> list[str]:
    """The Parquet files under ``root`` (a folder may be named ``x.parquet``), relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet") if p.is_file())


def _rows(out, name):
    return pq.read_table(out / name).to_pylist()


@pytest.mark.e2e
def test_every_shard_has_its_own_output_at_its_relative_path(cases_run):
    inp, out, run_dir, _ = cases_run
    inputs, outputs = _parquet(inp), _parquet(out)
    assert outputs == sorted(inputs + ["text/notes.parquet", "text/table.parquet", "rank-0.parquet"])
    assert len(inputs) == 9
    for name in inputs:
        ids = pq.read_table(inp / name).column("id").to_pylist()
        ids = [i if isinstance(i, str) else json.dumps(i, sort_keys=True) for i in ids]
        assert [r["id"] for r in _rows(out, name)] == ids
    # No temporary file anywhere in the output.
    assert [p for p in out.rglob("*") if p.name.startswith(".")] == []
    done = RunDir(run_dir).done()
    assert sorted(done) == sorted(inputs + ["text/notes.jsonl", "text/table.csv", "rank-0.json"]) and all(done[n]["rows"] == pq.read_metadata(inp / n).num_rows for n in inputs)


@pytest.mark.e2e
def test_hive_partitions_both_kept(cases_run):
    _, out, _, _ = cases_run
    en, fr = _rows(out, "lang=en/part-0.parquet"), _rows(out, "lang=fr/part-0.parquet")
    assert [r["id"] for r in en] == ["en-1", "en-2"] and [r["id"] for r in fr] == ["fr-1", "fr-2"]
    assert all(r["generation"] and r["error"] is None for r in en + fr)


@pytest.mark.e2e
def test_invalid_utf8_fails_only_its_row(cases_run):
    _, out, _, _ = cases_run
    rows = {r["id"]: r for r in _rows(out, "utf8/docs.parquet")}
    assert list(rows) == ["u1", "u2", "u3"]
    assert "not valid UTF-8" in rows["u2"]["error"] and rows["u2"]["generation"] is None
    assert all(rows[k]["error"] is None and rows[k]["generation"] for k in ("u1", "u3"))
    assert [r["source"] for r in rows.values()] == pq.read_table(
        CASES / "01-invalid-utf8-string-column" / "input" / "docs.parquet").column("source").to_pylist()
    large = _rows(out, "utf8/large.parquet")
    assert large[0]["error"] is None and large[0]["generation"]
    assert "not valid UTF-8 (byte 0xc3 at offset 0)" in large[1]["error"]
    # Nested ids are keys by their JSON text (docs/outputs.md: the output schema), in the output and the check.
    assert [r["id"] for r in large] == ['{"doc": 1}', '{"doc": 2}', '{"doc": 1}']
    assert large[2]["error"] == """duplicate id '{"doc": 1}' (first at row 0)"""


@pytest.mark.e2e
def test_truncation_leaves_room_for_the_new_tokens(cases_run):
    _, out, _, _ = cases_run
    rows = {r["id"]: r for r in _rows(out, "long/mixed.parquet")}
    long = rows["long"]
    assert long["error"] is None and long["prompt_truncated"]
    assert long["prompt_tokens"] == MAX_LEN - NEW  # cut to exactly the room left (~3,800 tokens before)
    assert long["output_tokens"] == NEW or long["finish_reason"] == "stop"
    assert not rows["short"]["prompt_truncated"] and rows["short"]["prompt_tokens"] < MAX_LEN - NEW


@pytest.mark.e2e
def test_odd_and_long_names_and_one_dataset_over_different_schemas(cases_run):
    inp, out, run_dir, _ = cases_run
    assert _rows(out, ODD_NAME)[0]["generation"] and _rows(out, LONG_NAME)[0]["generation"]
    table = read_output(str(out)).to_table()
    assert table.num_rows == sum(pq.read_metadata(inp / p).num_rows for p in _parquet(inp)) + 5 + 3 + 1
    assert {"source", "lang"} <= set(table.column_names)  # docs.parquet's column, the hive key
    by_id = {json.dumps(r["id"]): r for r in table.to_pylist()}
    assert by_id['"en-1"']["lang"] == "en" and by_id['"u1"']["source"] is not None
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["shards_done"] == 12 and summary["rows"] == table.num_rows


@pytest.mark.e2e
def test_report_status_calibration_and_resume_count_each_row_once(cases_run):
    """Issue #30: with shards named like the run directory's own files (part-0.parquet in hive
    folders, data.parquet/part-00000.parquet, events.json/part-0.parquet, rank-0.json), the
    report, pipeline.status, the planner's calibration and a rerun count every output row once.
    Expected values are counted from the output shards themselves. (The report read each
    part-0.parquet shard's metrics folder as one more file: those rows twice; the done markers'
    reader read the folder events.json as a marker.)"""
    from pipeline.plan.calibrate import workload_from_run
    from pipeline.report.summary import summarize_run
    from pipeline.report.text import summary_text
    from pipeline.status import status_text

    _, out, run_dir, args = cases_run
    cols = ["error", "prompt_tokens", "output_tokens", "prefill_s"]
    rows = [r for name in _parquet(out) for r in pq.read_table(out / name, columns=cols).to_pylist()]
    served = [r for r in rows if r["error"] is None]
    report = summarize_run(run_dir)
    # Every row with an error was refused before it reached an engine (7 by hand: two bytes that
    # are not UTF-8, a duplicate id, three JSON Lines and one CSV line): none is a request.
    assert len(rows) - len(served) == 7 and report["errors"] == 0
    assert (report["requests"], report["prompt_tokens"], report["output_tokens"]) == (
        len(served), sum(r["prompt_tokens"] for r in served), sum(r["output_tokens"] for r in served))
    assert report["checked_against_output"] == {"shards": 12, "mismatches": []}
    text = status_text(RunDir(run_dir))
    assert "shards: 12 done, 0 failed, 12 total" in text and f"rows: {len(rows)}/{len(rows)} " in text, text
    calibrated = sorted(r["prompt_tokens"] for r in served if r["prefill_s"] is not None)
    assert sorted(workload_from_run(run_dir).prompt_tokens) == calibrated and calibrated

    # A rerun over the finished run dir finds every shard done and changes nothing.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    again = run_pipeline(*args)
    assert again.returncode == 0 and "nothing to do: all 12 shards are already done" in again.stdout, again.stderr[-3000:]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    # The report checks itself: one request metrics file more than the output holds is an
    # error in its summary, not a figure.
    metrics = run_dir / "metrics" / "requests" / "rank-0.json"
    (extra,) = [p for p in metrics.iterdir() if p.is_file()]
    copy = extra.with_name("part-copy.parquet")
    copy.write_bytes(extra.read_bytes())
    try:
        doubled = summarize_run(run_dir)
        one = pq.read_table(extra).to_pylist()[0]
        assert doubled["checked_against_output"]["mismatches"] == [
            f"requests {len(served) + 1} in the request metrics, {len(served)} in the output",
            f"prompt tokens {report['prompt_tokens'] + one['prompt_tokens']} in the request metrics, "
            f"{report['prompt_tokens']} in the output",
            f"output tokens {report['output_tokens'] + one['output_tokens']} in the request metrics, "
            f"{report['output_tokens']} in the output"]
        assert summary_text(doubled).splitlines()[0].startswith("colocated run: error: these figures do not match")
    finally:
        copy.unlink()


@pytest.mark.e2e
def test_jsonl_and_csv_shards_bad_lines_are_error_rows(cases_run):
    _, out, _, _ = cases_run
    notes = _rows(out, "text/notes.parquet")  # 5 lines that are not blank: 5 rows, in file order
    assert [r["id"] for r in notes] == ["j1", None, "j3", None, "j5"]  # a bad byte keeps its line's id
    assert "line_error" not in notes[0]  # the why is in the error column
    assert notes[1]["error"].startswith("line 3 is not valid JSON")
    assert notes[2]["error"].startswith("line 4 is not valid UTF-8")
    assert notes[3]["error"] == "line 5 is a JSON array, not an object"
    for r in (notes[0], notes[4]):
        assert r["error"] is None and r["generation"] and r["prompt_tokens"] > 0
    assert [r["score"] for r in notes] == [1.0, None, None, None, 2.5]  # typed from the head: double
    table = _rows(out, "text/table.parquet")
    assert [r["id"] for r in table] == ["c1", None, "c3"]
    assert table[1]["error"] == "line 3 has 4 fields; the header has 3"
    assert [r["score"] for r in table] == [3, None, 4]
    for r in (table[0], table[2]):
        assert r["error"] is None and r["generation"]
