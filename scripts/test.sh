#!/usr/bin/env bash
# Set up (first time only) and run the test suite: scripts/test.sh [--fast] [pytest args]
#   --fast               only the tests recorded under 1 s (tests/durations.py); the full suite is the default
#   --record-durations   (a pytest option) write each test's time to tests/durations.json
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Tests never reach the network: wandb is disabled through the environment (the mode
# argument alone still lets a telemetry probe out at exit).
export WANDB_MODE=disabled WANDB_SILENT=true
export MPLBACKEND=Agg
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then args+=(-m "not slow"); else args+=("$arg"); fi
done
exec .venv/bin/python -m pytest -n 2 --dist loadfile "${args[@]}"
