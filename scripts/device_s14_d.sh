#!/usr/bin/env bash
# Session 14, call D: programmatic dependent launch (models/kernels/pdl.py) on and off.
# GPU tests of the kernels that use it; decode at batch 1 / 1k context with GEARSHIFT_PDL
# 1, 0, 1; offline throughput (256 prompts, 512 in / 256 out, <= 64 running, budget 512),
# one pass with it on and one off, each in its own process.
# Usage (device tool): bash scripts/device_s14_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 200 python -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_decode_kernel.py \
  tests/kernels/test_fused_ops.py tests/kernels/test_skinny_gemm.py tests/kernels/test_sample_kernel.py \
  tests/gpu/test_skinny_model.py > "$OUT/gpu_tests.log" 2>&1
echo "kernel tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
for pdl in 1 0 1; do
  echo "bs1 GEARSHIFT_PDL=$pdl:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl timeout 120 python -m gearshift.cli bench offline --preset llama-3.1-8b \
    --load-format dummy --max-num-seqs 64 --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$OUT/bs1_pdl$pdl.$SECONDS.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
done
for pdl in 1 0; do
  echo "offline GEARSHIFT_PDL=$pdl:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl timeout 150 python scripts/exp_token_budget.py --budgets 512 --passes 1 \
    --out "$OUT/token_budget_pdl$pdl.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
