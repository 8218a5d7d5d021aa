#!/usr/bin/env bash
# Idempotent set-up: a project virtual environment in .venv with the right torch build.
# On a machine without CUDA it installs the CPU build of torch (never a multi-GB CUDA build);
# on a GPU machine it keeps the CUDA build it finds or installs one. A second run reuses
# everything already installed and only checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HARNESS_VENV:-.venv}"
PY="${PYTHON:-python3}"
TORCH_CPU_VERSION="2.13.0"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

stamp="$VENV/.harness-installed"
want="$(sha1sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VPY" -c "import torch, harness" 2>/dev/null; then
    exit 0
fi

if ! "$VPY" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "[setup] CUDA device found: installing a CUDA build of torch"
        "$VPY" -m pip install --quiet torch
    else
        echo "[setup] no CUDA device: installing the CPU build torch==$TORCH_CPU_VERSION"
        "$VPY" -m pip install --quiet "torch==$TORCH_CPU_VERSION"
    fi
fi
echo "[setup] installing recall-harness and its dependencies"
"$VPY" -m pip install --quiet -e ".[dev]"
# The fused CPU kernels of the chunk forms are compiled once here (about 25 s, cached), so the
# first run does not pay for it; without a compiler it warns and the batched form runs.
echo "[setup] building the fused CPU kernel"
"$VPY" -c "from harness.ops.fused_cpu import build; build()"
echo "$want" > "$stamp"
