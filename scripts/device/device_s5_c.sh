#!/usr/bin/env bash
# Session 5, call C: GPU tests after the skinny GEMM's fused prologues (add + RMSNorm +
# qkv / gate_up, SiLU + down); decode at batch 1 (auto vs off); offline throughput at
# chunk 256; an eager profile of the same run's mixed steps 300-304 (does the extend kernel
# take as long outside CUDA graphs? call B: 66.6 us per layer graphed, 37.4 us in a fresh
# eager engine). Usage (device tool): bash scripts/device/device_s5_c.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 300 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py tests/gpu \
  2>&1 | tail -25 > "$OUT/gpu_tests.txt"; tail -4 "$OUT/gpu_tests.txt" >> "$OUT/log.txt"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed|Error|error"; }
T="--num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens 256"
echo "== eager profiled run, chunk 256, steps 300-304 (also fills Triton's cache)" >> "$OUT/log.txt"
timeout 150 $B $T --no-cuda-graphs --profile-steps 300 5 --profile-out "$OUT/prof_extend_eager.txt" \
  --output-json /tmp/prof_eager.json 2>&1 | show >> "$OUT/log.txt"
for mode in auto off auto; do
  echo "== decode bs1 ctx1k skinny=$mode" >> "$OUT/log.txt"
  GEARSHIFT_SKINNY_GEMM=$mode timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$OUT/decode_bs1_$mode.json" 2>&1 | show >> "$OUT/log.txt"
done
echo "== throughput chunk 256 skinny=auto" >> "$OUT/log.txt"
timeout 150 $B $T --output-json "$OUT/thr256.json" 2>&1 | show >> "$OUT/log.txt"
python - "$OUT" >> "$OUT/log.txt" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/decode_bs1_auto.json"))
for r in d.get("skinny_gemm", {}).get("shapes", []):
    if r["rows"] <= 2:
        print(r["op"], r["rows"], r["n"], r["k"], r["choice"], {k[7:20]: round(v * 1e3, 1) for k, v in r["ms"].items()})
PY
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
