#!/usr/bin/env bash
# Session 16, call B: programmatic dependent launch (GEARSHIFT_PDL) on the H200. GPU kernel
# and model tests with PDL on (the default there), then offline (budget 512) and batch-1
# decode with PDL on and off, interleaved, in one lease.
# Usage (device tool): bash scripts/device/device_s16_b.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
date -u +%FT%TZ > "$OUT/log.txt"
timeout 240 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/kernels/test_decode_kernel.py tests/kernels/test_fused_ops.py tests/gpu/test_skinny_model.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
for pdl in on off on off; do
  echo "PDL $pdl offline:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl timeout 120 python scripts/exp_token_budget.py --budgets 512 --passes 1 \
    --out "$OUT/token_budget_$pdl.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
for pdl in on off; do
  echo "PDL $pdl bs1:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl timeout 100 python -m gearshift.cli "${BS1[@]}" --output-json "$OUT/bs1_$pdl.json" \
    2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
