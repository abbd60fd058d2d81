#!/usr/bin/env bash
# Session 13, call D: graphed kernel tables of issue 2's two decode shapes, to find what a
# decode step spends beyond weight and K/V streaming: batch 1 at 1k context (steps 40-51
# of a 1-prompt run) and batch 64 at ~640 context (steps 700-711 of the offline run at
# budget 2048, where 973 of 1,042 steps are plain decode).
# Usage (device tool): bash scripts/device/device_s13_d.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
timeout 200 $B --num-prompts 1 --input-len 1024 --output-len 128 --profile-steps 40 12 \
  --profile-out "$OUT/prof_bs1.txt" --output-json "$OUT/bs1.json" > /dev/null 2>&1
echo "bs1 rc $?"
timeout 300 $B --num-prompts 256 --input-len 512 --output-len 256 --profile-steps 700 12 \
  --profile-out "$OUT/prof_bs64.txt" --output-json "$OUT/bs64.json" > /dev/null 2>&1
echo "bs64 rc $?"
for f in prof_bs1 prof_bs64; do head -1 "$OUT/$f.txt" | cut -c1-300; cut -c1-70,170-240 "$OUT/$f.txt" | sed -n 5,30p; done
