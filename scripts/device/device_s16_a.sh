#!/usr/bin/env bash
# Session 16, first issue-2 call. Session 15's norm fusion (norms inside the GEMMs, residual
# adds in their epilogues) shortened batch-1 decode by 0.15 ms but left the 64-row decode
# step at 6.07 ms, although the chooser timed the fused kernels faster than norm + cuBLAS.
# Graphed kernel tables of 64-row decode steps (steps 700-711 of the offline run at budget
# 2048, plain decode) with the fusion on and off say where the time went; a third run
# profiles 512-token mixed steps (budget 512, steps 262-271) of the current code.
# Usage (device tool): bash scripts/device/device_s16_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
W="--num-prompts 256 --input-len 512 --output-len 256"
for mode in fused plain; do
  flag=""; [ "$mode" = plain ] && flag="--no-fuse-norms"
  timeout 280 $B $flag $W --profile-steps 700 12 \
    --profile-out "$OUT/prof_bs64_$mode.txt" --output-json "$OUT/bs64_$mode.json" > "$OUT/log_$mode.txt" 2>&1
  echo "$mode rc $?"
  head -1 "$OUT/prof_bs64_$mode.txt" | cut -c1-300
  cut -c1-70,170-240 "$OUT/prof_bs64_$mode.txt" | sed -n 5,26p
done
timeout 200 $B $W --max-num-batched-tokens 512 --profile-steps 262 10 \
  --profile-out "$OUT/prof_mixed512.txt" --output-json "$OUT/mixed512.json" > "$OUT/log_mixed.txt" 2>&1
echo "mixed rc $?"
head -1 "$OUT/prof_mixed512.txt" | cut -c1-300
cut -c1-70,170-240 "$OUT/prof_mixed512.txt" | sed -n 5,22p
grep -h "output_tok_per_s\|step_ms_median" "$OUT"/log_*.txt
