#!/usr/bin/env bash
# Prepared in session 17 for the next session, call A: the split-K TMA tilings
# (SkinnyConfig.split_k; opt-in chooser candidates at 1-16 and 64 rows under
# GEARSHIFT_SKINNY_SPLITK=1) first through the GPU skinny tests (bf16 split-K is only
# tested on a GPU), then batch-1 decode and offline (budget 512) with them and without;
# each run's JSON holds the chooser's picks and timings (skinny_gemm).
# Usage (device tool): bash scripts/device_s18_a.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  > "$OUT/gpu_tests.log" 2>&1
rc=$?; echo "gpu tests rc $rc" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
if [ $rc -eq 0 ]; then
  for v in 1 0; do
    echo "split-K candidates $v bs1:" >> "$OUT/log.txt"
    GEARSHIFT_SKINNY_SPLITK=$v timeout 100 python -m gearshift.cli "${BS1[@]}" \
      --output-json "$OUT/bs1_$v.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
  done
  for v in 1 0 1 0; do
    tag=$v.$RANDOM
    echo "split-K candidates $v offline:" >> "$OUT/log.txt"
    GEARSHIFT_SKINNY_SPLITK=$v timeout 100 python scripts/exp_token_budget.py --budgets 512 \
      --passes 1 --out "$OUT/tb_$tag.json" > "$OUT/run_$tag.log" 2>&1
    grep "^budget" "$OUT/run_$tag.log" >> "$OUT/log.txt" || tail -5 "$OUT/run_$tag.log" >> "$OUT/log.txt"
  done
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
