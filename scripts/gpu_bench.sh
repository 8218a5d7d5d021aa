#!/usr/bin/env bash
# The GPU benchmark in one command: set up, then time every family and form of harness.ops on one
# CUDA device for T = 256 ... 65,536 (forward, forward + backward, peak memory), decoding at
# contexts 256 / 16,384 / 65,536 and the training loop (sized to finish in under five minutes on
# one H200), then grouped training against solo runs at the quick profile's shapes, groups of 8 to
# 64, wall seconds per step (harness.bench.group; a few minutes more, an estimate). Writes
# $OUT/bench_gpu.{json,txt} and $OUT/bench_group_gpu.{json,txt} (OUT defaults to results/bench);
# extra arguments go to `python -m harness.bench` (e.g. --bf16, --chunk-sizes 64,128,256).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT="${OUT:-results/bench}"
mkdir -p "$OUT"
.venv/bin/python - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_bench.sh: torch sees no CUDA device")
print(f"[gpu_bench] {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
.venv/bin/python -m harness.bench --device cuda --seq-lens 256,1024,4096,16384,65536 \
    --decode-contexts 256,16384,65536 --recurrent-max-len 4096 --max-call-s 5 --time-budget-s 210 \
    --json "$OUT/bench_gpu.json" "$@" 2>&1 | tee "$OUT/bench_gpu.txt"
.venv/bin/python -m harness.bench.group --device cuda --sizes 8,16,32,64 --steps 30 --warmup 10 --bound \
    --json "$OUT/bench_group_gpu.json" 2>&1 | tee "$OUT/bench_group_gpu.txt"
