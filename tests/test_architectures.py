"""Models other than the bundled one, through the pipeline's paths on real vLLM and NIXL (issue
#38, section 1): a Qwen2-style model (attention bias, 2 KV heads), a Mistral-style sliding window
shorter than the prompts, 8 KV heads of head dim 128, and a head dim that is not hidden size /
heads (:mod:`tests.models`: random weights from a config, made here).

Each run's output is checked against Hugging Face transformers' own greedy ``generate`` on the
chat template's own rendering of the same rows (:func:`tests.reference.hf_greedy`), a reference
that shares no code with the pipeline or vLLM; ids, order and prompt lengths are read back with
pyarrow. The suite runs one path per model, together covering colocated, push, pull, the DRAM
tier and pools of different TP; ``tools/arch_matrix.py`` runs every path for every model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.helpers import ROOT, SAMPLE, start_run
from tests.models import make_model
from tests.reference import hf_greedy, sample_rows

pytestmark = pytest.mark.e2e

SHARD = SAMPLE / "part-00000.parquet"
MAX_NEW = 16
PUSH = ["pools=disaggregated", "transport=nixl_push"]
PULL = ["pools=disaggregated", "transport=nixl_pull"]
# run -> (model, overrides): one path per model.
RUNS = {
    "qwen2-colocated": ("qwen2-bias", ["pools=colocated"]),
    "qwen2-push-prefill-tp2": ("qwen2-bias", [*PUSH, "model.prefill_tp=2"]),
    "mistral-window-pull-dram": ("mistral-window", [*PULL, "offload=dram", "offload.dram_gib=1"]),
    "qwen3-headdim-push": ("qwen3-headdim", PUSH),
    "kv8-hd128-pull": ("llama-kv8-hd128", PULL),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("models")
    return {name: make_model(name, base / name) for name in sorted({m for m, _ in RUNS.values()})}


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory) -> dict:
    out = {}
    for run, (model, overrides) in RUNS.items():
        out[run] = start_run(tmp_path_factory, run, f"model.path={models[model]}", f"model.name={model}",
                             f"job.sampling.max_new_tokens={MAX_NEW}", *overrides, input_url=str(SHARD)).wait()
    return out


@pytest.fixture(scope="module")
def transformers_reference(models) -> dict[str, list[dict]]:
    """model -> ``[{id, prompt_ids, token_ids}]`` of the shard, by transformers alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    template = yaml.safe_load((ROOT / "conf" / "job" / "summarize.yaml").read_text())["prompt_template"]
    out = {}
    for name, path in models.items():
        rows = sample_rows(SHARD, template, AutoTokenizer.from_pretrained(path))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for row, tokens in zip(rows, hf_greedy(model, [r["prompt_ids"] for r in rows], MAX_NEW)):
            row["token_ids"] = tokens
        out[name] = rows
    return out


@pytest.mark.parametrize("run", RUNS)
def test_output_equals_transformers_generate(models, runs, transformers_reference, run):
    model, overrides = RUNS[run]
    done = runs[run]
    want = transformers_reference[model]
    out = pq.read_table(done.output / SHARD.name).to_pylist()
    assert [r["id"] for r in out] == [r["id"] for r in want]
    assert [r["error"] for r in out] == [None] * len(want)
    assert [r["prompt_tokens"] for r in out] == [len(r["prompt_ids"]) for r in want]
    assert [r["generation_token_ids"] for r in out] == [r["token_ids"] for r in want]
    if "pools=disaggregated" in overrides:
        # The KV crossed: decode received every prompt token but at most one (vLLM's counters).
        assert all(r["prompt_tokens"] - 1 <= r["kv_tokens"] <= r["prompt_tokens"] for r in out), \
            [(r["prompt_tokens"], r["kv_tokens"]) for r in out]
    # Each engine ran at its pool's TP, with the model's own context (model.max_model_len null:
    # config.json's max_position_embeddings, which 1 GiB of KV cache holds for these models) and
    # eager on this CPU, as vLLM resolved them.
    engines = done.engines()
    context = json.loads((models[model] / "config.json").read_text())["max_position_embeddings"]
    for role, engine in engines.items():
        tp = next((int(o.split("=")[1]) for o in overrides if o.startswith(f"model.{role}_tp=")), 1)
        assert (engine["tp"], engine["max_model_len"], engine["enforce_eager"]) == (tp, context, True), (role, engine)


def test_the_sliding_window_shapes_the_output(models, runs, transformers_reference):
    """The Mistral-style model's window (64 tokens) is shorter than every prompt, and it matters:
    transformers without the window generates otherwise for some row, so the run matching the
    windowed reference above means vLLM applied the window through prefill, KV transfer and
    decode."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = transformers_reference["mistral-window"]
    assert min(len(r["prompt_ids"]) for r in rows) > 64
    model = AutoModelForCausalLM.from_pretrained(models["mistral-window"], dtype=torch.float32).eval()
    model.config.sliding_window = None
    unwindowed = hf_greedy(model, [r["prompt_ids"] for r in rows], MAX_NEW)
    assert any(u != r["token_ids"] for u, r in zip(unwindowed, rows))
