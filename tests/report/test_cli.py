"""pipeline.report.cli: ``python -m pipeline.report`` writes the report and the comparison, and
a bad run directory is one line on stderr with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.report.cli import main
from tests.helpers import ROOT
from tests.report.synthetic import make_run


def test_cli(tmp_path, capsys):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", stretch=2.0)
    assert main([str(a), "--compare", str(b), "--out", str(tmp_path / "out"), "--stall-ms", "100"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "out") in out and "compare.json" in out
    assert "stalls (> 100 ms) 1 in 1 requests" in out
    for name in ("report.json", "timeline.png", "latency.png", "utilisation.png",
                 "compare.json", "compare.png"):
        assert (tmp_path / "out" / name).is_file()
    assert json.loads((tmp_path / "out" / "report.json").read_text())["stall_threshold_s"] == 0.1
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run directory not found") and err.count("\n") == 1


def test_cli_as_module(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pipeline.report", str(tmp_path / "empty")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("error: run directory not found") and p.stderr.count("\n") == 1
