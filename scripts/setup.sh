#!/usr/bin/env bash
# Idempotent set-up: a project virtual environment in .venv with the right torch build.
# On a machine without CUDA it installs the CPU build of torch (never a multi-GB CUDA build),
# from PyTorch's CPU wheel index, or from the configured index when that one is unreachable
# (scripts/choose_torch.py); on a GPU machine it keeps the CUDA build it finds or installs one.
# A second run reuses everything already installed and only checks it. pip's own output goes
# to .venv/setup.log and is shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HARNESS_VENV:-.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
LOG="$VENV/setup.log"

stamp="$VENV/.harness-installed"
want="$(sha1sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VPY" -c "import torch, harness" 2>/dev/null; then
    exit 0
fi

quietly() {  # run a set-up step with its output in the log; on failure show the log's end
    if ! "$@" >>"$LOG" 2>&1; then
        echo "[setup] failed: $*" >&2
        echo "[setup] the last lines of $LOG:" >&2
        tail -n 25 "$LOG" >&2
        exit 1
    fi
}

if ! "$VPY" -c "import torch" 2>/dev/null; then
    read -r -a torch_args < <("$PY" scripts/choose_torch.py 2>"$LOG.why")
    echo "[setup] $(cat "$LOG.why")"
    quietly "$VPY" -m pip install --quiet "${torch_args[@]}"
fi
echo "[setup] installing recall-harness and its dependencies"
quietly "$VPY" -m pip install --quiet -e ".[dev]"
# The fused CPU kernels of the chunk forms are compiled once here (about a minute of two cores,
# cached under a hash of their sources), so the first run does not pay for it; without a
# compiler it warns and the batched form runs.
echo "[setup] building the fused CPU kernel"
"$VPY" -c "from harness.ops.fused_cpu import build; build()"
echo "$want" > "$stamp"
