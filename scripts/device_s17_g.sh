#!/usr/bin/env bash
# Session 17, call G: o_proj's weights prefetched into L2 on a side stream during decode
# attention, the attention's K/V loads evict-first (GEARSHIFT_L2_PREFETCH=1), against off:
# offline (budget 512), one run each.
# Usage (device tool): bash scripts/device_s17_g.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
for v in ${VARIANTS:-1 0}; do
  echo "l2 prefetch $v offline:" >> "$OUT/log.txt"
  GEARSHIFT_L2_PREFETCH=$v timeout 80 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/tb_$v.json" > "$OUT/run_$v.log" 2>&1
  grep "^budget" "$OUT/run_$v.log" >> "$OUT/log.txt" || tail -5 "$OUT/run_$v.log" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
