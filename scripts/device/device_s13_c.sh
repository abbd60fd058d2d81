#!/usr/bin/env bash
# Session 13, call C: where the offline run's 256-token mixed step spends its ~9.5 ms
# (device_s13_b.sh: the decode-heavy extend tile saved 0.05 ms of it, not the 0.3 ms its
# microbenchmark promised).
# 1. scripts/bench_gemm_rows.py: the layer GEMMs at 128 / 256 / 512 rows, cuBLAS against
#    the Triton tile kernel's tilings;
# 2. scripts/profile_decode.py: kernel table of eager mixed steps, 60 decoders at 640
#    context with 4 new 512-token prompts chunked at budget 256.
# Usage (device tool): bash scripts/device/device_s13_c.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 300 python scripts/bench_gemm_rows.py --rows 128 256 512 --out "$OUT/gemm_rows.json" \
  > "$OUT/gemm_rows.log" 2>&1
echo "bench_gemm_rows rc $?" >> "$OUT/log.txt"; cat "$OUT/gemm_rows.log" >> "$OUT/log.txt"
timeout $((585 - SECONDS)) python scripts/profile_decode.py --batch-size 60 --context 640 \
  --mixed 4 --mixed-len 512 --chunk 256 --steps 4 --out "$OUT/profile_mixed.txt" > /dev/null 2>&1
echo "profile_decode rc $?" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"; head -c 6000 "$OUT/profile_mixed.txt"
