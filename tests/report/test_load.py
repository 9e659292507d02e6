"""pipeline.report.load: a missing, empty or unreadable run directory is a one-line error that
names it, and no report is written."""

from __future__ import annotations

import pytest

from pipeline.report.write import write_report


@pytest.mark.parametrize("kind", ["missing", "empty", "garbage"])
def test_bad_run_dir_is_a_clear_error(tmp_path, kind):
    run = tmp_path / "run"
    if kind != "missing":
        run.mkdir()
    if kind == "garbage":
        part = run / "metrics" / "requests" / "s0.parquet" / "part-0.parquet"
        part.parent.mkdir(parents=True)
        part.write_bytes(b"not parquet at all\nsecond line")
    exc_type = ValueError if kind == "garbage" else FileNotFoundError
    with pytest.raises(exc_type) as info:
        write_report(run)
    msg = str(info.value)
    assert "\n" not in msg and str(run) in msg
    assert not (run / "report").exists()
