#!/usr/bin/env bash
# Prepared in session 12 for the next session (not yet run). Call B: issue 2's two figures
# on today's code: decode at batch 1 / 1k context, and offline throughput (256 prompts,
# 512 in / 256 out, at most 64 running) at step budgets 256 (session 8's best), 384 and
# 512 (scripts/sim_offline_budget.py predicts +1.5-1.7% over 256). Call A: device_s13_a.sh.
# Usage (device tool): bash scripts/device_s13_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|elapsed"; }
timeout 150 $B --num-prompts 1 --input-len 1024 --output-len 128 \
  --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show >> "$OUT/log.txt"
timeout $((585 - SECONDS)) python scripts/exp_token_budget.py --budgets 256,384,512 --passes 2 \
  --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
