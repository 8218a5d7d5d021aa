#!/usr/bin/env bash
# Set up (first time only) and run the harness: scripts/run.sh task=recall model=elu [overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m harness "$@"
