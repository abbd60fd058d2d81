#!/usr/bin/env bash
# Session 3, second device call: GPU engine tests, the 8B-shaped bench pair, `bench sweep`
# over the chain policies (warm-up at start-up, lazy draft catch-up) and `bench burst`.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
timeout ${TEST_TIMEOUT:-100} python -m pytest -q -p no:cacheprovider tests/kernels/test_decode_fused_merge.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.txt" 2>&1; tail -4 "$OUT/gpu_tests.txt"
if grep -q "FAILED tests/kernels/test_decode_fused_merge" "$OUT/gpu_tests.txt"; then
  export GEARSHIFT_DECODE_MERGE=separate; echo "fused decode merge failed: separate merge for the benches"
fi
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-280} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --policies ${POLICIES:-goodput,off,always-2,always-4,threshold,threshold-vllm} \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
grep -v "it/s\]" "$OUT/sweep.txt" | tail -14 | cut -c1-200
timeout ${BURST_TIMEOUT:-120} $G bench burst --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/burst.json" > "$OUT/burst.txt" 2>&1; grep -v "it/s\]" "$OUT/burst.txt" | tail -22
