#!/usr/bin/env bash
# Session 2, last device call: GPU tests of the new paths (sampler kernel, goodput profile,
# graphed speculation), then on the 8B-shaped bench pair `bench sweep` (issue 4's table and
# plot) and `bench burst` (acceptance after speculation was pushed to K = 0).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
timeout 75 python -m pytest -q -p no:cacheprovider tests/kernels/test_sample_kernel.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.txt" 2>&1; tail -4 "$OUT/gpu_tests.txt"
if grep -q "FAILED tests/kernels/test_sample_kernel" "$OUT/gpu_tests.txt"; then
  export GEARSHIFT_SAMPLER=torch; echo "sampler kernel failed: torch sampler for the benches"
fi
timeout 60 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-240} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
grep -v "it/s\]" "$OUT/sweep.txt" | tail -14 | cut -c1-160
timeout ${BURST_TIMEOUT:-130} $G bench burst --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/burst.json" > "$OUT/burst.txt" 2>&1; grep -v "it/s\]" "$OUT/burst.txt" | tail -22
