#!/usr/bin/env bash
# Session 13, call E: decode attention's KV splits at every batch bucket (1..64) for two
# stage-1 block sets, to place the split rule between the batch-1 and batch-64 points of
# device_s13_a.sh; then the GPU kernel tests (the one-split path without a merge, the two
# extend variants' warm-up) and decode at batch 1 / 1k context on this tree (the lm_head
# through the skinny chooser, no merge launch at one split).
# Usage (device tool): bash scripts/device/device_s13_e.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python scripts/bench_decode_attn.py --out "$OUT/decode_splits.json" \
  --cases 1x1024,2x1024,4x1024,8x1024,16x640,32x640,64x640 \
  --blocks 64,4,2 64,8,3 128,4,2 128,8,3 > "$OUT/decode_splits.log" 2>&1
echo "bench_decode_attn rc $?"; grep -E "^batch|blocks \[" "$OUT/decode_splits.log"
timeout 150 python -m pytest -q -x tests/kernels -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "kernel tests rc $?"; tail -3 "$OUT/gpu_tests.log"
timeout $((585 - SECONDS)) python -m gearshift.cli bench offline --preset llama-3.1-8b \
  --load-format dummy --max-num-seqs 64 --num-prompts 1 --input-len 1024 --output-len 128 \
  --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | grep -E "output_tok|decode_step_ms_median |decode_device"
