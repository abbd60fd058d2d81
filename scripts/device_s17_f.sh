#!/usr/bin/env bash
# Session 17, call F: 8-warp TMA tilings as extra chooser candidates at 64 rows
# (GEARSHIFT_SKINNY_WIDE_WARPS=1) against the usual candidates: offline (budget 512)
# alternating; the picks are in the logs.
# Usage (device tool): bash scripts/device_s17_f.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
for v in 1 0 1 0; do
  echo "wide warps $v offline:" >> "$OUT/log.txt"
  tag=$v.$RANDOM
  GEARSHIFT_SKINNY_WIDE_WARPS=$v timeout 95 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/tb_$tag.json" > "$OUT/run_$tag.log" 2>&1
  grep "^budget" "$OUT/run_$tag.log" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
