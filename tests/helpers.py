"""What test modules share, in one place: a test module imports its helpers from here, never
from another test module or by adding to ``sys.path`` (``tools/`` is the namespace package
``tools``: ``from tools.long_prompts import ...``).

The paths, the pipeline's command line and the end-to-end runs' helpers (:class:`Run`,
:func:`start_run`, :func:`run_to_end`) and the test Slurm's are defined in ``tests/conftest.py``
beside the session fixtures that start the shared runs, and are named here for the tests.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

from tests.conftest import (COMMON, PREFILL_NODES, ROOT, SAMPLE, SLURM, SLURM_NODES, PendingRun, Run,
                            assert_across_hosts, last_core, node_bytes_sent, run_pipeline, start_run)
from tests.conftest import _run as run_to_end

# KV bytes per token of SmolLM2-135M in float32, by hand: 2 (K and V) x 30 layers x 3 KV heads
# x 64 head dim x 4 bytes (config.json of the converted model).
KV_BYTES_PER_TOKEN_FP32 = 2 * 30 * 3 * 64 * 4


def one_line_error(p: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed: exit status 2, no traceback, exactly one
    non-blank line on stderr, starting ``error: `` (asserted)."""
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def refused(*overrides: str) -> str:
    """The one line ``python -m pipeline +job=summarize run.progress=false OVERRIDES`` is refused
    with (:func:`one_line_error`)."""
    return one_line_error(run_pipeline("+job=summarize", "run.progress=false", *overrides))


__all__ = [
    "COMMON", "KV_BYTES_PER_TOKEN_FP32", "PREFILL_NODES", "PendingRun", "ROOT", "Run", "SAMPLE", "SLURM",
    "SLURM_NODES", "assert_across_hosts", "last_core", "node_bytes_sent", "one_line_error", "refused",
    "run_pipeline", "run_to_end", "start_run",
]


def config_hash_as_documented(config_yaml: str) -> str:
    """The output card's ``config_sha256`` as docs/outputs.md defines it, computed here: SHA-256 of
    the JSON (sorted keys, no spaces) of every ``RESULT_KEYS`` setting as ``config.yaml`` holds
    it, null when absent."""
    import yaml

    from pipeline.preflight.rerun import RESULT_KEYS

    data = yaml.safe_load(config_yaml)
    settings = {}
    for key in RESULT_KEYS:
        v = data
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        settings[key] = v
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
