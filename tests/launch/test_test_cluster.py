"""The test Slurm's daemons (slurm/start-test-cluster.sh: munged, slurmctld, slurmd) start with
the caller's open files closed: a pipe held open around the start script reaches EOF once the
script returns, i.e. no daemon kept its write end.

The script does nothing while the cluster is healthy, so when the cluster is already up (the
session fixture of tests/launch/test_slurm.py, or an earlier run) this test restarts it (stop
script, then start script) and leaves it up; when it was down, it stops it again afterwards."""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slurm

START, STOP = ROOT / "slurm" / "start-test-cluster.sh", ROOT / "slurm" / "stop-test-cluster.sh"
STATE = Path(os.environ.get("PD_SLURM_STATE", "/var/tmp/pd-slurm"))
PID_FILES = {"munged": Path("/run/munge/munged.pid"), "slurmctld": STATE / "slurmctld.pid",
             "slurmd": STATE / "slurmd.pid"}


def _daemons() -> dict[str, int]:
    """The running daemons of the test cluster, by name -> pid (from their pid files)."""
    out = {}
    for name, f in PID_FILES.items():
        try:
            pid = int(f.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            continue
        out[name] = pid
    return out


def _holders(target: str) -> list[str]:
    """Other processes with an open file descriptor on ``target`` (``pipe:[inode]``), as "pid name"."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                found.append(f"{proc.name} {(proc / 'comm').read_text().strip()}")
        except OSError:
            continue
    return found


def test_daemons_start_with_the_callers_open_files_closed():
    if os.geteuid() != 0:
        pytest.skip("the test Slurm needs root (apt-get, munge, slurmd)")
    was_up = len(_daemons()) == len(PID_FILES)
    if was_up:  # make the start script start every daemon while our pipe is open
        subprocess.run(["bash", str(STOP)], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    r, w = os.pipe()
    target = f"pipe:[{os.fstat(w).st_ino}]"
    try:
        try:
            p = subprocess.run(["bash", str(START)], pass_fds=(w,), stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=600)
        finally:
            os.close(w)
        assert p.returncode == 0, f"test Slurm did not come up:\n{p.stdout}\n{p.stderr}"
        daemons = _daemons()
        assert set(daemons) == set(PID_FILES), f"not running after the start script: {set(PID_FILES) - set(daemons)}"
        holders = _holders(target)
        ready, _, _ = select.select([r], [], [], 5)
        assert ready and os.read(r, 1) == b"", f"the caller's pipe is still held open by: {holders}"
        assert not holders
    finally:
        os.close(r)
        if not was_up:
            subprocess.run(["bash", str(STOP)], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
