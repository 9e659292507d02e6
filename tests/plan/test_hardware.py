"""Hardware presets (pipeline/plan/hardware.py)."""

from __future__ import annotations

import pytest

from pipeline.plan.hardware import HARDWARE, hardware


def test_presets_by_name_and_unknown_hardware():
    assert hardware("h100") is HARDWARE["h100"]
    with pytest.raises(ValueError, match="unknown hardware"):
        hardware("tpu")
