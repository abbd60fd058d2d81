#!/usr/bin/env bash
# Session 16, call G (at f74bc57; the knob is gone since): the fused-norm path up to 64
# rows against up to 32 (GEARSHIFT_FUSED_NORM_MAX_ROWS), offline at budget 512, one pass
# each in one lease.
# Usage (device tool): bash scripts/device/device_s16_g.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
for rows in 64 32; do
  echo "fused norms up to $rows rows:"
  GEARSHIFT_FUSED_NORM_MAX_ROWS=$rows timeout 110 python scripts/exp_token_budget.py --budgets 512 \
    --passes 1 --out "$OUT/token_budget_fused$rows.json" 2>&1 | grep "^budget"
done
