#!/usr/bin/env bash
# Session 15, call E: decode at batch 1 (1k context), this tree and OLD_TREE alternately,
# twice each, in one lease (the chooser's choices are in each JSON's skinny_gemm).
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s15_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ROOT=$PWD
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
date -u +%FT%TZ > "$OUT/log.txt"
for i in 1 2; do
  echo "this tree bs1 run $i:" >> "$OUT/log.txt"
  (cd "$ROOT" && PYTHONPATH=$ROOT timeout 120 python -m gearshift.cli "${BS1[@]}" \
    --output-json "$OUT/bs1_new_$i.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt")
  echo "old tree bs1 run $i:" >> "$OUT/log.txt"
  (cd "$ROOT/$OLD_TREE" && PYTHONPATH=$ROOT/$OLD_TREE timeout 120 python -m gearshift.cli "${BS1[@]}" \
    --output-json "$OUT/bs1_old_$i.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt")
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
