"""What the planner knows of a model: :class:`ModelShape`, from a preset, a ``conf/model`` config
or a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.engine.kv_layout import DTYPE_BYTES, kv_bytes_per_token

# vLLM 0.32's ``--kv-cache-dtype`` names (``CacheConfig.cache_dtype``) whose KV is one plain
# element per value, and that element's type (a key of DTYPE_BYTES). ``auto`` is the model's
# dtype. The fp8 names store one byte per element (vLLM: uint8 / float8_e4m3fn); the formats
# with per-token scales or packed 4-bit values are not modelled.
KV_CACHE_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "fp8": "fp8", "fp8_e4m3": "float8_e4m3fn",
                   "fp8_e5m2": "float8_e5m2", "fp8_inc": "float8_e4m3fn"}


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a decoder-only transformer (Llama-style, gated MLP).

    ``params`` is the total parameter count (weights read per decode step); ``dtype`` the weight
    element type (a key of :data:`pipeline.engine.kv_layout.DTYPE_BYTES`); ``kv_cache_dtype`` the
    KV cache's, by vLLM's name (``auto``: the same as the weights; ``fp8``, ``fp8_e4m3``,
    ``fp8_e5m2``, ``fp8_inc``: 1 byte; see :data:`KV_CACHE_DTYPES`); ``path`` the model directory
    when there is one (for its tokenizer).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: float
    dtype: str = "bfloat16"
    tied_embeddings: bool = False
    path: str | None = None
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown or unmodelled KV cache dtype {self.kv_cache_dtype!r}; "
                             f"known: auto, {', '.join(KV_CACHE_DTYPES)}")

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type (a key of DTYPE_BYTES): the weights' for ``auto``."""
        return self.dtype if self.kv_cache_dtype == "auto" else KV_CACHE_DTYPES[self.kv_cache_dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token, all layers, K and V: ``2 x layers x KV heads x head dim x bytes of
        the KV cache dtype`` (:func:`pipeline.engine.kv_layout.kv_bytes_per_token`)."""
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.kv_dtype)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights: ``params x bytes per element``."""
        return self.params * DTYPE_BYTES[self.dtype]

    @property
    def d_attn(self) -> int:
        """Attention width: query heads x head dim."""
        return self.heads * self.head_dim

    @property
    def flop_params(self) -> float:
        """Non-embedding parameters ``N`` of Kaplan et al. 2020: ``params`` less the embedding
        table(s) (``vocab x hidden``, twice when the LM head is not tied)."""
        return self.params - self.vocab * self.hidden * (1 if self.tied_embeddings else 2)


# Shapes from the models' Hugging Face config.json; params as published (70.6B, 8.03B).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-70b": {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 28672,
                      "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                      "params": 70.6e9},
    "llama-3.1-8b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
                     "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                     "params": 8.03e9},
}
CONF_MODELS = Path(__file__).resolve().parents[1] / "conf" / "model"  # the package's model configs


def count_params(config: dict) -> int:
    """Parameters of a Llama-style model from its HF ``config.json`` dict: per layer the Q, K, V,
    O projections (``hidden x (heads + 2 kv_heads) x head_dim + heads x head_dim x hidden``) and
    a gated MLP (``3 x hidden x intermediate``); plus ``vocab x hidden`` embeddings (twice when
    ``tie_word_embeddings`` is false). Norms are left out (< 0.01%)."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or h // heads
    per_layer = h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * config["intermediate_size"]
    tied = config.get("tie_word_embeddings", False)
    return config["num_hidden_layers"] * per_layer + config["vocab_size"] * h * (1 if tied else 2)


def shape_from_hf(config: dict, name: str, dtype: str | None = None, path: str | None = None) -> ModelShape:
    """A :class:`ModelShape` from an HF ``config.json`` dict (``text_config`` merged in, as the
    engine's KV sizing in :mod:`pipeline.engine.kv_layout` does). ``dtype`` defaults to the
    config's ``torch_dtype`` / ``dtype``, else bfloat16; ``params`` to :func:`count_params`.

    Raises:
        ValueError: a key is missing or the dtype is unknown.
    """
    config = {**config, **(config.get("text_config") or {})}
    try:
        heads = config["num_attention_heads"]
        dtype = dtype or str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        shape = ModelShape(
            name=name, layers=config["num_hidden_layers"], hidden=config["hidden_size"],
            heads=heads, kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            vocab=config["vocab_size"], params=float(config.get("params") or count_params(config)),
            dtype=dtype.replace("torch.", ""), tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            path=path)
    except KeyError as exc:
        raise ValueError(f"model {name}: config.json has no {exc.args[0]!r}") from None
    if shape.dtype not in DTYPE_BYTES:
        raise ValueError(f"model {name}: unknown dtype {shape.dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return shape


def load_model(ref: str, dtype: str | None = None) -> ModelShape:
    """The shape of model ``ref``: a preset (``llama-3.1-70b``, ``llama-3.1-8b``), a model config
    of ``conf/model/`` (``smollm2-135m``: its directory is resolved, converting the shipped model
    once, as the pipeline does), a model directory with a ``config.json``, or a ``config.json``.

    Raises:
        ValueError: ``ref`` is none of these, or its config lacks a needed key.
    """
    if ref in MODEL_PRESETS:
        return shape_from_hf(MODEL_PRESETS[ref], ref, dtype)
    if (CONF_MODELS / f"{ref}.yaml").exists():
        from pipeline.engine.model import model_path

        cfg = compose_config([f"model={ref}"])
        path = model_path(cfg)
        return shape_from_hf(read_json(Path(path) / "config.json"), ref, dtype or cfg.model.dtype, path)
    p = Path(ref)
    if p.is_dir() and (p / "config.json").exists():
        return shape_from_hf(read_json(p / "config.json"), p.name, dtype, str(p))
    if p.is_file() and p.suffix == ".json":
        return shape_from_hf(read_json(p), p.parent.name, dtype, str(p.parent))
    known = sorted([*MODEL_PRESETS, *(f.stem for f in CONF_MODELS.glob("*.yaml"))])
    raise ValueError(f"unknown model {ref!r}: not a preset ({', '.join(known)}), "
                     f"a model directory with config.json, or a config.json")


def read_json(path: Path) -> dict:
    """The JSON object in the file at ``path`` (a model's ``config.json``)."""
    with open(path) as f:
        return json.load(f)


def compose_config(overrides: list[str], job: str = "summarize"):
    """The pipeline's typed config for ``+job=JOB`` and ``overrides`` (Hydra, as a run composes it)."""
    from pipeline.config import compose

    return compose([f"+job={job}", *overrides])
