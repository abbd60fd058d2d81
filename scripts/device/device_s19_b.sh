#!/usr/bin/env bash
# Session 19, call B: (1) mixed steps on the fused decoder path (the residual add in
# cuBLAS's addmm_, the norm kernel alone; GEARSHIFT_FUSED_PATH_MAX_ROWS) against the
# add + norm path, offline, alternating, two pairs; (2) a graphed profile of 12 decode
# steps of the tail (queue empty, ~60 rows) on today's code.
# Usage (device tool): bash scripts/device/device_s19_b.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
for i in 1 2; do
  GEARSHIFT_FUSED_PATH_MAX_ROWS=100000 offline_run "fused path every step $i" fused$i
  offline_run "fused path <= 64 rows $i" base$i
done
date -u +%FT%TZ >> "$OUT/log.txt"
timeout 150 python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy \
  --max-num-seqs 64 --num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens 512 \
  --profile-steps 1030 12 --profile-out "$OUT/prof_decode_tail.txt" --output-json "$OUT/prof_run.json" \
  > "$OUT/prof_run.log" 2>&1 || tail -5 "$OUT/prof_run.log" >> "$OUT/log.txt"
head -3 "$OUT/prof_decode_tail.txt" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
