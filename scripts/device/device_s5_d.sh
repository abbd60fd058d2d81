#!/usr/bin/env bash
# Session 5, call D: the skinny chooser timed inside CUDA graphs (no host launch latency),
# the add + RMSNorm prologue in one pass (1/rms applied after the product), SiLU with
# shorter K tiles: GPU tests, decode at batch 1 (auto, off, auto), throughput at chunk 256.
# Usage (device tool): bash scripts/device/device_s5_d.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/gpu/test_skinny_model.py tests/gpu/test_gpu_engine.py 2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -4 "$OUT/gpu_tests.txt" >> "$OUT/log.txt"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed|Error|error"; }
for mode in auto off auto; do
  echo "== decode bs1 ctx1k skinny=$mode" >> "$OUT/log.txt"
  GEARSHIFT_SKINNY_GEMM=$mode timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$OUT/decode_bs1_$mode.json" 2>&1 | show >> "$OUT/log.txt"
done
echo "== throughput chunk 256 skinny=auto" >> "$OUT/log.txt"
timeout 150 $B --num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens 256 \
  --output-json "$OUT/thr256.json" 2>&1 | show >> "$OUT/log.txt"
python - "$OUT" >> "$OUT/log.txt" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/decode_bs1_auto.json"))
for r in d.get("skinny_gemm", {}).get("shapes", []):
    if r["rows"] <= 2:
        print(r["op"], r["rows"], r["n"], r["k"], r["choice"], {k[7:20]: round(v * 1e3, 1) for k, v in r["ms"].items()})
PY
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
