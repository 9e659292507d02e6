"""The local launcher's CPU slices."""

from __future__ import annotations

from pipeline.launch.local import cpu_slices


def test_cpu_slices_partition_cores():
    import os

    n = len(os.sched_getaffinity(0))
    slices = cpu_slices(2, "partition")
    assert len(slices) == 2
    if n >= 2:
        cores = [int(c) for s in slices for c in s.split(",")]
        assert sorted(cores) == sorted(os.sched_getaffinity(0)) and len(set(cores)) == n
    assert cpu_slices(3, "auto") == [None, None, None]
