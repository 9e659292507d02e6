"""Workloads (pipeline/plan/workload.py): explicit, and counted from the sample dataset with the
shipped model's tokenizer."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.plan.model import load_model
from pipeline.plan.workload import workload, workload_from_input
from tests.helpers import ROOT


def test_bad_workloads_raise_one_line_value_errors():
    with pytest.raises(ValueError, match="rate must be > 0"):
        workload(100, 10, rate=-1.0)
    with pytest.raises(ValueError, match="rate.*or a request count"):
        workload(100, 10)


def test_workload_from_input_tokenizes_the_sample_with_the_shipped_model():
    # The real tokenizer and the summarize job's template (about 20 s: transformers' import).
    model = load_model("smollm2-135m")
    assert model.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    wl = workload_from_input(str(ROOT / "data" / "sample"), model)
    rows = sum(pq.read_metadata(f).num_rows for f in (ROOT / "data" / "sample").glob("*.parquet"))
    assert wl.count == rows and len(wl.prompt_tokens) == rows and wl.rate is None
    job = yaml.safe_load((ROOT / "conf" / "job" / "summarize.yaml").read_text())
    assert wl.output_tokens == (job["sampling"]["max_new_tokens"],)
    # Every prompt holds the template ("Summarize the following document in one sentence.")
    # and the chat turn markers around a non-empty text: well over 10 tokens each.
    assert min(wl.prompt_tokens) > 10
