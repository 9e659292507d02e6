"""tools/bench.py from a finished run on: the figures of one run and the report over them, from a
synthetic disaggregated run directory (tests.report.synthetic; no vLLM is started)."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from tests.report.synthetic import REQUESTS, T0, make_run
from tools.bench_parts.e2e import report as report_mod, runs
from tools.benchlib.procs import python, spawn
from tools.benchlib.sampling import ProcSampler

ARGS = argparse.Namespace(max_new_tokens=8, dtype="float32", inflight=2, stall_ms=60.0, sample_s=0.05,
                          run_timeout=30.0, repeats=1, rows=3, shards=1)


def _fake_run_sampled(cmd, log, args, env=None):
    """What run_sampled returns, for a 'run' that writes the synthetic run directory."""
    run_dir = next(a.split("=", 1)[1] for a in cmd if a.startswith("run.dir="))
    make_run(Path(run_dir), requests=REQUESTS[:3])  # rows with tokens only
    with open(log, "w") as f:
        child = spawn(python("-c", "pass"), f)
        sampler = ProcSampler(child.pid, 0.05).start()
        child.wait()
        sampler.stop()
    return 0, sampler, T0 - 5.0, []


def test_one_run_figures_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "run_sampled", _fake_run_sampled)
    monkeypatch.setattr(runs, "pipeline_overrides", lambda name, args, wl: (["+job=summarize"], {}))
    monkeypatch.setattr(report_mod, "machine_text", lambda: "MACHINE")

    r = runs.run_pipeline_config("disagg-uniform", 0, ARGS, {"dir": str(tmp_path / "in"), "rows": 3}, tmp_path)

    assert r["command"].startswith("-m pipeline +job=summarize run.dir=")
    assert r["requests"] == 3 and r["startup_s"] == 5.0
    # The two ITL gaps > 60 ms (r0: .11 s, r1: .09 s) each overlap another request's KV arrival
    # and first step on the decode engine.
    assert r["stalls"] == 2
    assert r["stalls_by_cause"]["prefill"]["count"] == 2 and r["stalls_by_cause"]["none"]["count"] == 0
    assert r["handoff"]["requests"] == 3 and abs(r["handoff"]["message_p50_s"] - 0.01) < 1e-6
    assert r["steps"]["decode-0"]["steps"] == 5 and r["steps"]["prefill-0"]["steps"] == 3
    assert set(r["cpu"]) >= {"cores_by_process", "other_load_cores", "top_threads"}

    wl = {w: {"text_tokens": [100, 200, 1500], "long_rows": 1} for w in ("uniform", "mixed")}
    cfg = SimpleNamespace(model=SimpleNamespace(name="m", enforce_eager=True, max_model_len=2048, kv_cache_gib=1.0))
    facts: dict = {}
    text = report_mod.report(ARGS, cfg, wl, {"disagg-uniform": [r]}, ["disagg-uniform"], [], None, 1.0, facts)
    assert "## 2a. Disaggregated vs colocated, same 2 cores: uniform workload" in text
    assert "| stalls > threshold | - | 2 | - |" in text
    assert "| uniform | 3 | 10.0 / 10.0 / 10.0 |" in text
    assert facts["uniform"]["disagg_prefill_stalls"] == 2


def test_the_configurations_order_per_repeat():
    """--order: by hand, three configurations over three repeats."""
    from tools.bench_parts.e2e.configs import run_order

    names = ["a", "b", "c"]
    assert [run_order(names, r, "fixed") for r in range(2)] == [names, names]
    assert run_order(names, 1, "reverse") == ["c", "b", "a"]
    rotated = [run_order(names, r, "rotate") for r in range(3)]
    assert rotated == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted(place) == names for place in zip(*rotated))  # each once in every place
