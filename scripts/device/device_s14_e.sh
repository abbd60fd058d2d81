#!/usr/bin/env bash
# Session 14, call E: the session's final tree against OLD_TREE (session 13's last commit,
# carried as a `git archive`), in one lease: the sampler's compile test on the GPU, then
# offline throughput (256 prompts, 512 in / 256 out, <= 64 running, budget 512; one pass,
# the first after start-up: one-off costs included), new then old, and decode at batch 1.
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s14_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$PWD timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_sample_kernel.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "sample kernel tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
echo "this tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout 110 python scripts/exp_token_budget.py --budgets 512 --passes 1 \
  --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
echo "old tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$PWD/$OLD_TREE timeout 110 python "$OLD_TREE/scripts/exp_token_budget.py" --budgets 512 \
  --passes 1 --out "$OUT/token_budget_old.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
echo "this tree bs1:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout 90 python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy \
  --max-num-seqs 64 --num-prompts 1 --input-len 1024 --output-len 128 --output-json "$OUT/bs1.json" 2>&1 \
  | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
