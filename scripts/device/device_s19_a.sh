#!/usr/bin/env bash
# Prepared in session 18 for the next session, call A: decode attention's warps and
# stages at every batch bucket (session 18 found 2 warps 1.3-1.6 us a layer faster than 4
# at batch 64 / one split and adopted it there only; batch 1-48 and 1 warp are unmeasured),
# then the offline run and batch 1 on the final code for the page.
# Usage (device tool): bash scripts/device/device_s19_a.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 300 python scripts/bench_decode_attn.py --cases 1x1024,4x1024,16x1024,32x640,48x640,64x640 \
  --blocks 64,1,2 64,2,2 64,4,2 64,2,3 64,4,3 128,2,2 128,4,2 128,8,2 \
  --out "$OUT/decode_attn.json" > "$OUT/decode_attn.log" 2>&1
grep -E "^batch|blocks \[" "$OUT/decode_attn.log" >> "$OUT/log.txt"
source scripts/device/device_common.sh
bs1_run "final" final
offline_run "final" final
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
