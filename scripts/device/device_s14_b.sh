#!/usr/bin/env bash
# Session 14, call B: the fused decoder-layer products (RMSNorm into qkv / gate_up, SiLU
# into gate_up, residual adds into o_proj / down; models/kernels/skinny_gemm.py) on the GPU:
# their tests, decode at batch 1 / 1k context, offline throughput (256 prompts, 512 in /
# 256 out, <= 64 running, budget 512) on this tree and on OLD_TREE (a `git archive` of
# session 13's last commit, carried), and batch 1 on OLD_TREE.
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s14_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$PWD timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/gpu/test_skinny_model.py > "$OUT/gpu_tests.log" 2>&1
echo "skinny tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device"; }
bs1() {  # $1: tree, $2: json
  PYTHONPATH=$1 timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$2" 2>&1 | show >> "$OUT/log.txt"
}
echo "this tree bs1:" >> "$OUT/log.txt"; bs1 "$PWD" "$OUT/bs1_new.json"
echo "this tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout 200 python scripts/exp_token_budget.py --budgets 512 \
  --passes 2 --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
if [ -n "${OLD_TREE:-}" ]; then
  echo "old tree offline:" >> "$OUT/log.txt"
  PYTHONPATH=$PWD/$OLD_TREE timeout 200 python "$OLD_TREE/scripts/exp_token_budget.py" \
    --budgets 512 --passes 2 --out "$OUT/token_budget_old.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
  echo "old tree bs1:" >> "$OUT/log.txt"; bs1 "$PWD/$OLD_TREE" "$OUT/bs1_old.json"
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
