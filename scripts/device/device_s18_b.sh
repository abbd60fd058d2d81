#!/usr/bin/env bash
# Prepared in session 17 for the next session, call B: step budgets on one engine, two
# interleaved passes: 512 (the bench's), 384, and SGLang-style mixed chunks (dN: the
# step's decoders + N prefill tokens). Session 17's simulation on its costs
# (scripts/sim_offline_budget.py --costs s17): 7,604 / 7,632 / d256 7,683 / d320 7,644.
# Usage (device tool): bash scripts/device/device_s18_b.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 560 python scripts/exp_token_budget.py --budgets 512,d256,d320,384 --passes 2 \
  --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
