#!/usr/bin/env bash
# Engine-core checks after overlap scheduling, EXTEND graphs and the fused RoPE + KV store:
# GPU test tiers, then decode at batch 1 / 1k context and offline throughput (Llama-3.1-8B
# preset, dummy bf16) at several prefill chunk sizes. Usage (device tool): bash scripts/device/device_s2_core.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout ${TEST_TIMEOUT:-200} python -m pytest -q -p no:cacheprovider tests/kernels tests/gpu \
  2>&1 | tail -30 > "$OUT/gpu_tests.txt"; tail -6 "$OUT/gpu_tests.txt"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed|Error|error"; }
echo "== decode bs1 ctx1k"; timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
  --output-json "$OUT/decode_bs1_ctx1k.json" 2>&1 | show
for c in ${CHUNKS:-512 256}; do
  echo "== throughput chunk $c"
  timeout 150 $B --num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens $c \
     --output-json "$OUT/throughput_chunk$c.json" 2>&1 | show
done
