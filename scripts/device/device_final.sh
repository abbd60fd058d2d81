#!/usr/bin/env bash
# The session's GPU checks in one device-tool call: correctness tiers on the H200, then
# engine-core and speculation-cost benchmarks (Llama-3.1-8B preset, dummy bf16 weights).
# Usage (device tool): bash scripts/device/device_final.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/kernels tests/gpu \
  "tests/e2e/test_spec_trap.py" 2>&1 | tail -25 > "$OUT/gpu_tests.txt"; tail -5 "$OUT/gpu_tests.txt"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed"; }
echo "== decode bs1 ctx1k"; $B --num-prompts 1 --input-len 1024 --output-len 128 --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show
for c in 2048 1024; do
  echo "== throughput chunk $c"
  $B --num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens $c \
     --output-json "$OUT/throughput_chunk$c.json" 2>&1 | show
done
echo "== spec costs"; python -m gearshift.bench.spec_costs --k 4 --output-json "$OUT/spec_costs_k4.json" 2>&1 | grep -E "ms_median|over_decode|acceptance"
