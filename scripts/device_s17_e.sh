#!/usr/bin/env bash
# Session 17, call E: the fused-norm TMA GEMM summing its squares per row each K block
# (GEARSHIFT_RMS_SQ=rows: [BLOCK_M] registers) against elementwise ([BLOCK_M, BLOCK_K]),
# with a 32-column 6-stage TMA candidate at 64 rows: GPU skinny tests, then offline
# (budget 512) and batch-1 decode alternating; the chooser's timings are in the JSONs.
# Usage (device tool): bash scripts/device_s17_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 90 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -2 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
for v in rows elem rows elem; do
  echo "sq $v offline:" >> "$OUT/log.txt"
  GEARSHIFT_RMS_SQ=$v timeout 100 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/tb_$v.$RANDOM.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
