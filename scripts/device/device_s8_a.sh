#!/usr/bin/env bash
# Session 8, call A: (1) issue 2: offline throughput against the step token budget on one
# engine (scripts/exp_token_budget.py, 2 interleaved passes); (2) issue 4: the confirmation
# sweep for c = 1..16 (scripts/device/device_focus.sh, 8 passes) in the remaining time.
# Usage (device tool): bash scripts/device/device_s8_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/budget_log.txt"
timeout 230 python scripts/exp_token_budget.py --budgets "${BUDGETS:-160,192,256,384,2048}" \
  --passes 2 --out "$OUT/token_budget.json" 2>&1 | grep -v "bench offline" >> "$OUT/budget_log.txt"
date -u +%FT%TZ >> "$OUT/budget_log.txt"
cat "$OUT/budget_log.txt"
END=$((585 - SECONDS)) CONC=${CONC:-1,2,4,8,16} PASSES=${PASSES:-8} bash scripts/device/device_focus.sh
