#!/usr/bin/env bash
# Session 16, call D: PDL with the long kernels (GEMMs, decode attention) triggering after their main
# loop, prefetch 2 stages, against PDL off: batch-1 decode, then offline (budget 512).
# Usage (device tool): bash scripts/device_s16_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
date -u +%FT%TZ > "$OUT/log.txt"
for v in off:2 on:2 off:2 on:2; do
  pdl=${v%:*}; pf=${v#*:}
  echo "PDL $pdl prefetch $pf bs1:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl GEARSHIFT_PDL_PREFETCH_STAGES=$pf timeout 100 python -m gearshift.cli "${BS1[@]}" \
    --output-json "$OUT/bs1_${pdl}_$pf.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
done
for v in off:1 on:2; do
  pdl=${v%:*}; pf=${v#*:}
  echo "PDL $pdl prefetch $pf offline:" >> "$OUT/log.txt"
  GEARSHIFT_PDL=$pdl GEARSHIFT_PDL_PREFETCH_STAGES=$pf timeout 120 python scripts/exp_token_budget.py \
    --budgets 512 --passes 1 --out "$OUT/token_budget_${pdl}_$pf.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
