#!/usr/bin/env bash
# Session 19, call C (final code: every step of a folded model on the fused path): GPU
# tests (tests/gpu, the HF parity tests), batch 1, the offline run twice, then step
# budgets 512 / 1024 / 2048 on one engine (decode steps got cheaper since session 13's
# last 2048 run, which favours larger budgets).
# Usage (device tool): bash scripts/device/device_s19_c.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
timeout 300 python -m pytest -q -p no:cacheprovider tests/gpu tests/e2e/test_hf_parity.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
bs1_run "final" final
offline_run "final 1" final1
offline_run "final 2" final2
timeout 200 python scripts/exp_token_budget.py --budgets 512,1024,2048 --passes 1 \
  --out "$OUT/budgets.json" > "$OUT/budgets.log" 2>&1
grep "^budget" "$OUT/budgets.log" >> "$OUT/log.txt" || tail -5 "$OUT/budgets.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
