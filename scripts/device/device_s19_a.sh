#!/usr/bin/env bash
# Session 19, call A: (1) decode attention's warps and stages at every batch bucket
# (session 18 kept 2 warps at batch 33-64 only); (2) the layer products at 128-256 rows in
# their fused kinds, TMA tilings against cuBLAS (scripts/bench_mid_gemm.py); (3) offline
# throughput at budget 512 and at decoders + 96..192 on today's code (the mixed-step cost
# of small chunks, for scripts/sim_offline_budget.py).
# Usage (device tool): bash scripts/device/device_s19_a.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 240 python scripts/bench_decode_attn.py --cases 1x1024,4x1024,16x1024,32x640,48x640,64x640 \
  --blocks 64,1,2 64,2,2 64,4,2 64,2,3 64,4,3 128,2,2 128,4,2 128,8,2 \
  --out "$OUT/decode_attn.json" > "$OUT/decode_attn.log" 2>&1
grep -E "^batch|blocks \[" "$OUT/decode_attn.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
timeout 200 python scripts/bench_mid_gemm.py --out "$OUT/mid_gemm.json" > "$OUT/mid_gemm.log" 2>&1
grep -E "^m[0-9]+:" "$OUT/mid_gemm.log" >> "$OUT/log.txt"; tail -3 "$OUT/mid_gemm.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
timeout 200 python scripts/exp_token_budget.py --budgets 512,d96,d128,d160,d192 --passes 1 \
  --out "$OUT/token_budget.json" > "$OUT/run.log" 2>&1
grep "^budget" "$OUT/run.log" >> "$OUT/log.txt" || tail -5 "$OUT/run.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
