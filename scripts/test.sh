#!/usr/bin/env bash
# Set up (first time only) and run the whole test suite: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Tests never reach the network: wandb is disabled through the environment (the mode
# argument alone still lets a telemetry probe out at exit).
export WANDB_MODE=disabled WANDB_SILENT=true
export MPLBACKEND=Agg
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
