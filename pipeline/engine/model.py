"""The model every worker of a run loads: its directory (the bundled model is converted once),
its tokenizer, and its KV bytes per token."""

from __future__ import annotations

from typing import Any

from pipeline.config import Config
from pipeline.model import resolve_model_path


def model_path(cfg: Config) -> str:
    """The model directory (or hub id) every worker loads; converts the bundled model on first use."""
    return resolve_model_path(cfg.model.path, cfg.model.source, cfg.model.name)


def load_tokenizer(cfg: Config) -> Any:
    """The model's Hugging Face tokenizer (the one vLLM itself uses)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(cfg))


def model_kv_bytes_per_token(cfg: Config) -> int:
    """KV bytes per token of the configured model (see :mod:`pipeline.engine.kv_layout`)."""
    from transformers import AutoConfig

    from pipeline.engine.kv_layout import kv_bytes_per_token_from_hf

    hf = AutoConfig.from_pretrained(model_path(cfg)).to_dict()
    hf.update(hf.get("text_config") or {})
    return kv_bytes_per_token_from_hf(hf, cfg.model.dtype)
