#!/usr/bin/env bash
# Prepared in session 12 for the next session's issue-2 calls (not yet run). Call A, the
# kernel microbenchmarks (timed as the skinny chooser times: CUDA graph, L2 evicted):
# 1. scripts/bench_skinny.py with its wider 32 / 64-row tilings (BLOCK_N up to 128, 8 warps):
#    does any beat cuBLAS on the 8B shapes at the batch-64 decode's 64 rows? (Session 5's
#    BLOCK_N 16 / 32 set did not; cuBLAS runs gate_up / down at 83-88% of bandwidth there.)
#    A winner would then go into skinny_select.CANDIDATES, where the start-up chooser times it.
# 2. scripts/bench_decode_attn.py: KV splits x (BLOCK_N, warps, stages) of the decode
#    attention at batch 1 / 1k context and batch 64 / 640 against the engine's default.
# Call B (device_s13_b.sh): the two figures on the engine.
# scripts/sim_offline_budget.py --what-if says what each microsecond is worth.
# Usage (device tool): bash scripts/device_s13_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 300 python scripts/bench_skinny.py --rows 1 16 32 64 --out "$OUT/skinny.json" \
  > "$OUT/skinny.log" 2>&1
echo "bench_skinny rc $?" >> "$OUT/log.txt"; grep "m= *\(1\|64\) " "$OUT/skinny.log" >> "$OUT/log.txt"
timeout $((585 - SECONDS)) python scripts/bench_decode_attn.py --out "$OUT/decode_attn.json" \
  > "$OUT/decode_attn.log" 2>&1
echo "bench_decode_attn rc $?" >> "$OUT/log.txt"; cat "$OUT/decode_attn.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
