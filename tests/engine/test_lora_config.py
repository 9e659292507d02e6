"""``model.lora`` without an engine: the engine arguments it gives, the checks at start, and each
row's adapter from ``job.lora_column``."""

from __future__ import annotations

import json

import pytest

from pipeline.config import ConfigError, compose
from pipeline.engine.lora import lora_engine_kwargs, row_adapters
from pipeline.preflight.engine_args import check_engine_args, check_lora


def _adapter(path, r, weights: bool = True) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r}))
    if weights:
        (path / "adapter_model.safetensors").write_bytes(b"")
    return str(path)


def test_engine_arguments_cover_every_adapter_plus_an_empty_slot(tmp_path):
    assert lora_engine_kwargs(compose(["+job=summarize"])) == {}
    cfg = compose(["+job=summarize", f"model.lora.a={_adapter(tmp_path / 'a', 8)}",
                   f"model.lora.b={_adapter(tmp_path / 'b', 12)}"])
    # Rank 12 rounds up to the next rank vLLM accepts (16); 2 adapters + the slot base rows read.
    assert lora_engine_kwargs(cfg) == {"enable_lora": True, "max_loras": 3, "max_cpu_loras": 3, "max_lora_rank": 16}


def test_refused_at_start_with_the_setting_named(tmp_path):
    for bad, why in [("/no/such/dir", "model.lora.x: '/no/such/dir' is not a directory"),
                     (str(tmp_path), "model.lora.x: .* has no adapter_config.json"),
                     (_adapter(tmp_path / "big", 1024), "model.lora.x: rank 1024 is above the largest vLLM serves"),
                     (_adapter(tmp_path / "zero", 0), "model.lora.x: .*r \\(the LoRA rank\\) is 0"),
                     (_adapter(tmp_path / "bare", 8, weights=False), "model.lora.x: .* has no adapter weights")]:
        with pytest.raises(ConfigError, match=why):
            check_lora(compose(["+job=summarize", f"model.lora.x={bad}"]))
    for key in ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"):
        with pytest.raises(ConfigError, match=f"model.engine_kwargs.{key}: set by the pipeline; use model.lora"):
            check_engine_args(compose(["+job=summarize", f"model.engine_kwargs.{key}=1"]))


def test_each_rows_adapter_or_why_not():
    got = row_adapters([None, "", "tiny", "nope", 3], "lora", {"tiny": "/a"})
    assert got == [(None, None), (None, None), ("tiny", None),
                   (None, "lora is 'nope', not an adapter of model.lora (known: tiny)"),
                   (None, "lora is int, not an adapter name")]
    assert row_adapters(["tiny"], "lora", {})[0][1] == (
        "lora is 'tiny', not an adapter of model.lora (known: none: model.lora is empty)")
