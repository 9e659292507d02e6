"""Bad configuration and missing input end in one line naming the cause and a non-zero exit."""

from __future__ import annotations

import pytest

from conftest import run_pipeline


def _one_line_error(p) -> str:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_missing_input_path(tmp_path):
    missing = tmp_path / "nowhere"
    line = _one_line_error(run_pipeline("+job=summarize", f"job.input={missing}", f"run.root={tmp_path}"))
    assert "job.input" in line and str(missing) in line


def test_input_without_parquet(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    line = _one_line_error(run_pipeline("+job=summarize", f"job.input={tmp_path}", f"run.root={tmp_path}"))
    assert "no .parquet shards" in line


def test_unknown_job():
    line = _one_line_error(run_pipeline("+job=translate"))
    assert "job/translate" in line and "summarize" in line


def test_no_job():
    assert "+job=" in _one_line_error(run_pipeline())


@pytest.mark.parametrize("override, key", [
    ("pools.prefill=two", "pools.prefill"),
    ("pools.prefill=0", "pools.prefill"),
    ("transport.connector=Bogus", "transport.connector"),
    ("job.sampling.temperature=-1", "job.sampling.temperature"),
    ("job.no_such_key=1", "job.no_such_key"),
    ("pools=nope", "pools/nope"),
])
def test_wrong_config_value(override, key):
    assert key.split(".")[-1] in _one_line_error(run_pipeline("+job=summarize", override))
