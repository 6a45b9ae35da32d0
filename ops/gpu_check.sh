#!/usr/bin/env bash
# GPU readiness in one prepared run (under 9 minutes on an H200; exits 0 at once without CUDA):
#   1. tests/gpu (pytest -m gpu): int4/int8 linears on CUDA equal dequantize-then-matmul; tiny models
#      in bfloat16 on CUDA close to float32 on CPU; every speculation mode (chains and trees) equals
#      plain decoding token for token in bfloat16, int4 and float32 on CUDA.
#   2. ops/bench/gpu_bound.py: batch-1 decode of a random-weight Qwen3-8B shape in bfloat16 and int4,
#      step time against the memory-bandwidth bound (bandwidth measured by a device copy).
#   3. ops/bench/ceiling.py --random-hybrid: the oracle's ceiling (plain vs chain vs tree over
#      recurrent state, verification cost by size) on a random 8-layer Qwen3.5-layout hybrid.
# Results go to $OUT (the device runner's folder) or bench-results/gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
RESULTS="${OUT:-bench-results/gpu}"
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device here: skipped"
    exit 0
fi
mkdir -p "$RESULTS"
"$PYTHON" -c 'import torch; print("gpu_check:", torch.__version__, torch.cuda.get_device_name(0))'
status=0
timeout 270 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/gpu --junitxml="$RESULTS/gpu_tests.xml" \
    2>&1 | tee "$RESULTS/gpu_tests.log" || status=1
timeout 180 "$PYTHON" -m ops.bench.gpu_bound --config qwen3-8b --formats bfloat16,int4 --out "$RESULTS/gpu_bound.json" \
    2>&1 | tee "$RESULTS/gpu_bound.log" || status=1
timeout 90 "$PYTHON" -m ops.bench.ceiling --random-hybrid qwen3_5 --device cuda --max-tokens 64 --repeats 2 \
    2>&1 | tee "$RESULTS/hybrid_ceiling.log" || status=1
exit "$status"
