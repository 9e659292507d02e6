"""Failpoints (pipeline/runtime/failpoints.py): the faults the fault tests inject are read in that
one module only, are inert unless their variable is set, and each is documented in
docs/development.md. The freeze is tried on a real child process."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.runtime import failpoints

ROOT = Path(__file__).resolve().parents[2]

READERS = {failpoints.decode_start_delay_s: failpoints.DECODE_START_DELAY_S,
           failpoints.kv_faults: failpoints.KV_FAULTS,
           failpoints.prefill_freeze_s: failpoints.PREFILL_FREEZE_S,
           failpoints.prefill_start_delay_s: failpoints.PREFILL_START_DELAY_S,
           failpoints.decode_kill_after_rows: failpoints.DECODE_KILL_AFTER_ROWS}


@pytest.mark.parametrize("read", list(READERS), ids=lambda f: f.__name__)
def test_inert_unless_set(read, monkeypatch):
    name = READERS[read]
    monkeypatch.delenv(name, raising=False)
    assert read() == 0
    monkeypatch.setenv(name, "")
    assert read() == 0
    monkeypatch.setenv(name, "7")
    assert read() == 7
    for bad in ("soon", "-1"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=re.escape(f"{name}={bad!r}")):
            read()


def test_only_the_failpoints_module_reads_the_variables():
    """A worker that read ``os.environ`` itself would hide a fault from the one list of them."""
    prefix = "PD_PIPELINE_INJECT_"
    readers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("*.py") if prefix in p.read_text())
    assert readers == ["pipeline/runtime/failpoints.py"]


def test_every_failpoint_the_tests_set_is_listed_and_documented():
    used = {m for p in (ROOT / "tests").rglob("*.py") if p.name != "test_failpoints.py"
            for m in re.findall(r"PD_PIPELINE_INJECT_[A-Z_]+", p.read_text())}
    assert used, "the fault tests set no failpoint: was tests/roles/test_faults.py moved?"
    assert used <= set(failpoints.FAILPOINTS)
    page = (ROOT / "docs" / "development.md").read_text()
    section = page.split("## Failpoints", 1)[1].split("\n## ", 1)[0]
    assert [n for n in failpoints.FAILPOINTS if f"`{n}" not in section] == []


def test_freeze_children_stops_a_real_child_and_continues_it():
    """In a process of its own (the freeze stops every descendant of the caller): a child
    ``sleep`` is stopped (state T in /proc) within the freeze and running again after it. A
    signal is delivered asynchronously, so each state is waited for with a deadline (read at
    once, the child was seen still sleeping under load)."""
    code = textwrap.dedent("""
        import asyncio, subprocess, time, psutil
        from pipeline.runtime.failpoints import freeze_children

        child = subprocess.Popen(["sleep", "30"])
        async def state(stopped, within):
            deadline = time.monotonic() + within
            while (psutil.Process(child.pid).status() == "stopped") != stopped and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return psutil.Process(child.pid).status()
        async def go():
            t0 = time.monotonic()
            freeze_children(3.0)
            frozen = await state(True, 2.0)
            assert time.monotonic() - t0 < 3.0, "the freeze ended before the child was seen stopped"
            await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))
            return frozen, await state(False, 5.0)
        try:
            print(*asyncio.run(go()))
        finally:
            child.kill()
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    frozen, after = p.stdout.split()
    assert frozen == "stopped" and after in ("sleeping", "running"), p.stdout


def test_the_tests_the_page_names_exist():
    page = (ROOT / "docs" / "development.md").read_text()
    section = page.split("## Failpoints", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", section)
    assert len(named) == len(failpoints.FAILPOINTS)
    assert [f"{f}::{t}" for f, t in named if f"def {t}(" not in (ROOT / f).read_text()] == []
