"""The GPU checks (tools/gpu_dram_check.py, tools/gpu_nixl_check.py) start here, with no GPU:
their --dry-run runs the same code with host memory on both sides (NIXL: a real transfer whose
bytes are compared; the DRAM tier: the decode engine's block copy from a /dev/shm pool) and
prints SKIP for what needs a GPU. What they measure on a GPU is in BENCHMARKS.md when one was
lent; here only that they run, check, and report one line per check."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def _dry(script: str, *args: str) -> list[str]:
    p = subprocess.run([sys.executable, f"tools/{script}", "--dry-run", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln[:4] in ("PASS", "FAIL", "SKIP", "INFO")]
    assert not [ln for ln in lines if ln.startswith("FAIL")], lines
    return lines


def test_nixl_check_moves_and_compares_bytes_without_a_gpu():
    lines = _dry("gpu_nixl_check.py")
    assert lines[0].startswith("SKIP cuda")
    assert sum(ln.startswith("PASS 4 MiB DRAM -> DRAM bytes") for ln in lines) == 2  # both ways
    assert any(ln.startswith("INFO 4 MiB rates: NIXL") for ln in lines)


def test_dram_check_starts_and_runs_the_load_path_without_a_gpu(tmp_path):
    lines = _dry("gpu_dram_check.py", "--work", str(tmp_path), "--rows", "2")
    assert lines[0].startswith("PASS input: 2 rows of 4000-7500 tokens")
    assert sum(ln.startswith("SKIP") for ln in lines) == 5
    assert lines[-1].startswith("PASS DRAM -> KV cache (decode's load path)")
