#!/usr/bin/env bash
# Session 5, call A: the skinny GEMM (kernel tests, microbenchmark against cuBLAS on the 8B
# shapes), its effect on decode at batch 1 / 1k context and on offline throughput (8B preset,
# dummy bf16; GEARSHIFT_SKINNY_GEMM=off vs auto), kernel profiles of decode at batch 1 and
# 64 and of mixed chunked-prefill steps. Usage (device tool): bash scripts/device/device_s5_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py 2>&1 | tail -5 >> "$OUT/log.txt"
timeout 200 python scripts/bench_skinny.py --out "$OUT/skinny.json" >> "$OUT/log.txt" 2>&1
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed|Error|error"; }
for mode in off auto; do
  echo "== decode bs1 ctx1k skinny=$mode" >> "$OUT/log.txt"
  GEARSHIFT_SKINNY_GEMM=$mode timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$OUT/decode_bs1_$mode.json" 2>&1 | show >> "$OUT/log.txt"
done
for mode in off auto; do
  echo "== throughput chunk 256 skinny=$mode" >> "$OUT/log.txt"
  GEARSHIFT_SKINNY_GEMM=$mode timeout 150 $B --num-prompts 256 --input-len 512 --output-len 256 \
    --max-num-batched-tokens 256 --output-json "$OUT/thr256_$mode.json" 2>&1 | show >> "$OUT/log.txt"
done
P="timeout 150 python scripts/profile_decode.py --preset llama-3.1-8b"
{ echo "#### decode bs1 ctx1024 (auto)"; $P --batch-size 1 --context 1024 --out /tmp/p1.txt >/dev/null 2>&1; cat /tmp/p1.txt
  echo "#### decode bs64 ctx640 (auto)"; $P --batch-size 64 --context 640 --out /tmp/p2.txt >/dev/null 2>&1; cat /tmp/p2.txt
  echo "#### mixed: 60 decoding (ctx 640) + 4 x 512 prompts, chunk 256 (auto)"
  $P --batch-size 60 --context 640 --mixed 4 --mixed-len 512 --chunk 256 --steps 4 --out /tmp/p3.txt >/dev/null 2>&1; cat /tmp/p3.txt
} > "$OUT/profiles.txt" 2>&1
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt" | grep -v "^qkv\|^o_proj\|^gate_up\|^down\|^lm_head" | tail -40
grep -E "^(qkv|o_proj|gate_up|down|lm_head)" "$OUT/log.txt" | cut -c1-150
