#!/usr/bin/env bash
# Session 13, call B (after device_s13_a.sh's microbenchmarks led to three changes: decode
# splits for 2 waves, a wide 64-row skinny tiling, the decode-heavy extend tile):
# 1. scripts/bench_extend_attn.py on the graph-layout cases that place the decode-heavy
#    threshold (a 512-token mixed step; a lone 256-token chunk in the 256-token graph);
# 2. issue 2's decode at batch 1 / 1k context;
# 3. offline throughput (256 prompts, 512 in / 256 out, <= 64 running) at budgets 256,
#    512 and 2048 on this tree, and at 256 on the tree before the changes (OLD_TREE, a
#    `git archive` of the previous commit carried to the device) for an A/B in one lease.
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s13_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$PWD timeout 120 python scripts/bench_extend_attn.py --out "$OUT/extend_cases.json" \
  --cases mixed_graph mixed512_graph chunk256_graph > "$OUT/extend_cases.log" 2>&1
echo "bench_extend_attn rc $?" >> "$OUT/log.txt"; cat "$OUT/extend_cases.log" >> "$OUT/log.txt"
B="python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|elapsed"; }
PYTHONPATH=$PWD timeout 150 $B --num-prompts 1 --input-len 1024 --output-len 128 \
  --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show >> "$OUT/log.txt"
if [ -n "${OLD_TREE:-}" ]; then
  echo "old tree:" >> "$OUT/log.txt"
  PYTHONPATH=$PWD/$OLD_TREE timeout 200 python "$OLD_TREE/scripts/exp_token_budget.py" \
    --budgets 256 --passes 2 --out "$OUT/token_budget_old.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
fi
echo "this tree:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout $((590 - SECONDS)) python scripts/exp_token_budget.py \
  --budgets 256,512,2048 --passes 2 --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
