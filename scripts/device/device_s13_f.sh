#!/usr/bin/env bash
# Session 13, call F: the final tree against the session's starting one. GPU tests of the
# three attention kernels (decode's new split / block rule and one-split path, tree, the
# two extend variants), decode at batch 1 / 1k context, then offline throughput (256
# prompts, 512 in / 256 out, <= 64 running) at budgets 256, 512 and 2048 on this tree and
# at 512 on OLD_TREE (a `git archive` of the session's first commit, carried).
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s13_f.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$PWD timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_decode_kernel.py \
  tests/kernels/test_tree_kernel.py tests/kernels/test_extend_kernel.py tests/kernels/test_decode_fused_merge.py > "$OUT/gpu_tests.log" 2>&1
echo "attention kernel tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device"; }
PYTHONPATH=$PWD timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
  --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show >> "$OUT/log.txt"
echo "this tree:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout 200 python scripts/exp_token_budget.py --budgets 256,512,2048 \
  --passes 2 --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
if [ -n "${OLD_TREE:-}" ]; then
  echo "old tree:" >> "$OUT/log.txt"
  PYTHONPATH=$PWD/$OLD_TREE timeout $((590 - SECONDS)) python "$OLD_TREE/scripts/exp_token_budget.py" \
    --budgets 512 --passes 2 --out "$OUT/token_budget_old.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
