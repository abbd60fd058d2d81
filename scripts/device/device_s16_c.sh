#!/usr/bin/env bash
# Session 16, call C: PDL with wait-then-trigger (at most one kernel launched ahead) and
# the skinny GEMM's weight prefetch before its wait at 0 / 1 / 2 stages, against PDL off:
# batch-1 decode for each, then offline (budget 512) off / on.
# Variants are PDL:PREFETCH_STAGES pairs (BS1_VARIANTS, OFFLINE_VARIANTS override them).
# Usage (device tool): bash scripts/device/device_s16_c.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
date -u +%FT%TZ > "$OUT/log.txt"
for v in ${BS1_VARIANTS:-off:1 on:0 on:1 on:2}; do
  pdl=${v%:*}; pf=${v#*:}
  echo "PDL $pdl prefetch $pf bs1:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl GEARSHIFT_PDL_PREFETCH_STAGES=$pf timeout 100 python -m gearshift.cli "${BS1[@]}" \
    --output-json "$OUT/bs1_${pdl}_$pf.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
done
for v in ${OFFLINE_VARIANTS:-off:1 on:1}; do
  pdl=${v%:*}; pf=${v#*:}
  echo "PDL $pdl prefetch $pf offline:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl GEARSHIFT_PDL_PREFETCH_STAGES=$pf timeout 120 python scripts/exp_token_budget.py \
    --budgets 512 --passes 1 --out "$OUT/token_budget_${pdl}_$pf.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
