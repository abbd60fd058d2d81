#!/usr/bin/env bash
# GPU checks of speculation: the GPU test tier (spec greedy == plain with graphs, the
# flipping-policy trap on CUDA), then bench spec-costs (Llama-3.1-8B preset, K = 4).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu tests/e2e/test_spec_trap.py \
  2>&1 | tail -30 > "$OUT/gpu_spec_tests.txt"; tail -4 "$OUT/gpu_spec_tests.txt"
python -m gearshift.bench.spec_costs --k 4 --output-json "$OUT/spec_costs_k4.json" 2>&1 \
  | grep -E "ms_median|over_decode|acceptance|Error"
