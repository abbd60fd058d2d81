#!/usr/bin/env bash
# One device-tool run for the engine core: GPU correctness tiers, then the
# Llama-3.1-8B (dummy bf16) benchmarks. Writes logs + JSON under $OUT.
# Usage (device tool, carry [".whl"]): bash scripts/device/device_issue2.sh [chunk sizes...]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python -m pytest -q -x tests/kernels tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed"; }
$B --num-prompts 1 --input-len 1024 --output-len 128 --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show
for c in "${@:-2048}"; do
  echo "== max-num-batched-tokens $c"
  $B --num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens "$c" \
     --output-json "$OUT/throughput_chunk$c.json" 2>&1 | show
done
