#!/usr/bin/env bash
# Session 17, call D: RoPE + the K/V store inside the decode kernel
# (GEARSHIFT_DECODE_ROPE=fused) against the RoPE kernel first (separate): batch-1 decode
# and offline (budget 512) alternating, then the decode-kernel and engine GPU tests.
# Usage (device tool): bash scripts/device_s17_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
date -u +%FT%TZ > "$OUT/log.txt"
for v in fused separate fused separate; do
  echo "rope $v bs1:" >> "$OUT/log.txt"
  GEARSHIFT_DECODE_ROPE=$v timeout 100 python -m gearshift.cli "${BS1[@]}" \
    --output-json "$OUT/bs1_$v.$RANDOM.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
done
for v in fused separate fused separate; do
  echo "rope $v offline:" >> "$OUT/log.txt"
  GEARSHIFT_DECODE_ROPE=$v timeout 110 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/token_budget_$v.$RANDOM.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
timeout 170 python -m pytest -q -p no:cacheprovider tests/kernels/test_decode_kernel.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
