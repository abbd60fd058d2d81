#!/usr/bin/env bash
# Prepared in session 12, run in session 13 as call A (docs/benchmarks/
# 2026-11-30-h200-session13.md): the kernel microbenchmarks (timed as the skinny chooser
# times: CUDA graph, L2 evicted), in order of what each could be worth (scripts/sim_offline_budget.py --what-if):
# 1. scripts/bench_extend_attn.py: tile configs of the extend attention on the offline
#    run's mixed step (60 decoders + a 196-token chunk: 66.6 us a layer in session 5, three
#    waves at two programs an SM) and on a 2,048-token prefill, against extend_config.
# 2. scripts/bench_decode_attn.py: KV splits x (BLOCK_N, warps, stages) of the decode
#    attention at batch 1 / 1k context and batch 64 / 640, against the engine's default.
# 3. scripts/bench_skinny.py with wider 64-row tilings (BLOCK_N up to 128, 8 warps): does
#    any beat cuBLAS on the 8B shapes at the batch-64 decode's 64 rows? (Session 5's
#    BLOCK_N 16 / 32 set did not.) A winner would go into skinny_select.CANDIDATES.
# Call B (device_s13_b.sh): the two figures on the engine.
# Usage (device tool): bash scripts/device/device_s13_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 170 python scripts/bench_extend_attn.py --out "$OUT/extend_attn.json" > "$OUT/extend_attn.log" 2>&1
echo "bench_extend_attn rc $?" >> "$OUT/log.txt"; cat "$OUT/extend_attn.log" >> "$OUT/log.txt"
timeout 170 python scripts/bench_decode_attn.py --out "$OUT/decode_attn.json" > "$OUT/decode_attn.log" 2>&1
echo "bench_decode_attn rc $?" >> "$OUT/log.txt"; cat "$OUT/decode_attn.log" >> "$OUT/log.txt"
timeout $((585 - SECONDS)) python scripts/bench_skinny.py --rows 1 64 --out "$OUT/skinny.json" \
  > "$OUT/skinny.log" 2>&1
echo "bench_skinny rc $?" >> "$OUT/log.txt"; grep "m= " "$OUT/skinny.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
