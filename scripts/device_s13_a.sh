#!/usr/bin/env bash
# Prepared in session 12 for the next session's issue-2 call (not yet run):
# 1. scripts/bench_skinny.py with its wider 32 / 64-row tilings (BLOCK_N up to 128, 8 warps):
#    does any beat cuBLAS on the 8B shapes at the batch-64 decode's 64 rows? (Session 5's
#    BLOCK_N 16 / 32 set did not; cuBLAS runs gate_up / down at 83-88% of bandwidth there.)
#    A winner would then go into skinny_select.CANDIDATES, where the start-up chooser times it.
# 2. The two figures on today's code: decode at batch 1 / 1k context, and offline
#    throughput (256 prompts, 512 in / 256 out, at most 64 running) at step budgets 256
#    (session 8's best), 384 and 512 (scripts/sim_offline_budget.py predicts +1.5-1.7%).
# Usage (device tool): bash scripts/device_s13_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 240 python scripts/bench_skinny.py --rows 1 16 32 64 --out "$OUT/skinny.json" \
  > "$OUT/skinny.log" 2>&1
echo "bench_skinny rc $?" >> "$OUT/log.txt"; grep "m= *\(1\|64\) " "$OUT/skinny.log" >> "$OUT/log.txt"
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|elapsed"; }
timeout 150 $B --num-prompts 1 --input-len 1024 --output-len 128 \
  --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show >> "$OUT/log.txt"
timeout $((585 - SECONDS)) python scripts/exp_token_budget.py --budgets 256,384,512 --passes 2 \
  --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
