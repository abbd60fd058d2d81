#!/usr/bin/env bash
# Session 15, call K: fused norms (RMSNorm inside the GEMM after it, residual add inside
# the one before) against OLD_TREE (the commit before them, carried as a `git archive`),
# in one lease: skinny GEMM + GPU model tests, offline (one pass each, budget 512) and
# decode at batch 1, this tree then the old one.
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s15_k.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ROOT=$PWD
BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/gpu/test_skinny_model.py > "$OUT/gpu_tests.log" 2>&1
echo "skinny tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
echo "this tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$ROOT timeout 120 python scripts/exp_token_budget.py --budgets 512 --passes 1 \
  --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
echo "this tree bs1:" >> "$OUT/log.txt"
PYTHONPATH=$ROOT timeout 100 python -m gearshift.cli "${BS1[@]}" --output-json "$OUT/bs1.json" 2>&1 \
  | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
echo "old tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$ROOT/$OLD_TREE timeout 120 python "$OLD_TREE/scripts/exp_token_budget.py" --budgets 512 \
  --passes 1 --out "$OUT/token_budget_old.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
echo "old tree bs1:" >> "$OUT/log.txt"
(cd "$ROOT/$OLD_TREE" && PYTHONPATH=$ROOT/$OLD_TREE timeout 100 python -m gearshift.cli "${BS1[@]}" \
  --output-json "$OUT/bs1_old.json" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt")
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
