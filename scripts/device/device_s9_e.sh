#!/usr/bin/env bash
# Session 9, call E: every step of goodput (with and without the cost model's shared drift),
# always-4 and the tree at c = 2, 4, 8, 16 (3 rounds, 4 passes): goodput's VERIFY periods
# against the static policies' at equal (gear, batch size), and its scores when it left K = 4.
# Usage (device tool): bash scripts/device/device_s9_e.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 90 python -m gearshift.cli make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
timeout $((400 - SECONDS)) python scripts/diag_goodput_steps.py --model /tmp/big \
  --draft-model /tmp/bighead --concurrency ${CONC:-2,4,8,16} --rounds 3 --passes 4 \
  --out "$OUT/steps.json" 2>&1 | grep -v "Token indices" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
