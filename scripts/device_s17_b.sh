#!/usr/bin/env bash
# Session 17, call B: the extend kernel's tiles in request order against prefill chunks'
# tiles first (ExtendConfig.long_first): kernel times (scripts/bench_extend_attn.py), then
# offline (budget 512) alternating GEARSHIFT_EXTEND_LONG_FIRST=0 / 1, then GPU tests.
# Usage (device tool): bash scripts/device_s17_b.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python scripts/bench_extend_attn.py --classes-only \
  --cases mixed512_graph mixed_graph prefill --out "$OUT/extend_attn.json" >> "$OUT/log.txt" 2>&1
echo "extend bench rc $?" >> "$OUT/log.txt"
for v in ${OFFLINE_VARIANTS:-1 0 1 0}; do
  echo "long_first $v offline:" >> "$OUT/log.txt"
  GEARSHIFT_EXTEND_LONG_FIRST=$v timeout 110 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/token_budget_$v.$RANDOM.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
