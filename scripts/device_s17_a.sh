#!/usr/bin/env bash
# Session 17, call A: decoders riding in a mixed step through the decode kernel
# (decode_riders + the extend kernel over the chunks) against the extend kernel's decoder
# path: kernel times (scripts/bench_extend_attn.py), then offline (budget 512) alternating.
# Usage (device tool): bash scripts/device_s17_a.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python scripts/bench_extend_attn.py --classes-only \
  --cases mixed512_graph mixed_graph prefill --out "$OUT/extend_attn.json" >> "$OUT/log.txt" 2>&1
echo "extend bench rc $?" >> "$OUT/log.txt"
for v in ${OFFLINE_VARIANTS:-decode inline decode inline}; do
  echo "riders $v offline:" >> "$OUT/log.txt"
  GEARSHIFT_EXTEND_RIDERS=$v timeout 110 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/token_budget_$v.$RANDOM.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
