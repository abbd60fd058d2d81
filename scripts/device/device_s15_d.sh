#!/usr/bin/env bash
# Session 15, call D: the skinny chooser with the TMA / 6-stage tilings against OLD_TREE
# (session 14's last commit, carried as a `git archive`), in one lease: the skinny GEMM
# tests on the GPU, then offline throughput (256 prompts, 512 in / 256 out, <= 64 running,
# budget 512, two passes), this tree then the old one.
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s15_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$PWD timeout 200 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/gpu/test_skinny_model.py > "$OUT/gpu_tests.log" 2>&1
echo "skinny tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
echo "this tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout 150 python scripts/exp_token_budget.py --budgets 512 --passes 2 \
  --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
echo "old tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$PWD/$OLD_TREE timeout 150 python "$OLD_TREE/scripts/exp_token_budget.py" --budgets 512 \
  --passes 2 --out "$OUT/token_budget_old.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
