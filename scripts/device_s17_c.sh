#!/usr/bin/env bash
# Session 17, call C: decoders riding in a mixed step through decode_riders on a second
# stream, beside the extend kernel over the chunks (GEARSHIFT_EXTEND_RIDERS=concurrent),
# against the extend kernel's decoder path (inline): kernel times, offline (budget 512)
# alternating, then the extend / decode kernel GPU tests.
# Usage (device tool): bash scripts/device_s17_c.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python scripts/bench_extend_attn.py --classes-only \
  --cases mixed512_graph mixed_graph --out "$OUT/extend_attn.json" >> "$OUT/log.txt" 2>&1
echo "extend bench rc $?" >> "$OUT/log.txt"
for v in ${OFFLINE_VARIANTS:-concurrent inline concurrent inline}; do
  echo "riders $v offline:" >> "$OUT/log.txt"
  GEARSHIFT_EXTEND_RIDERS=$v timeout 110 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/token_budget_$v.$RANDOM.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_extend_kernel.py \
  tests/kernels/test_decode_kernel.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
