#!/usr/bin/env bash
# Session 5, call B: the skinny chooser with read-only L2 eviction; decode at batch 1 (auto
# vs off, same call); offline throughput at chunk 256 and 512 (auto); a torch.profiler
# table of graphed mixed EXTEND steps inside the throughput run (a separate, profiled run).
# Usage (device tool): bash scripts/device/device_s5_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64"
show() { grep -E "output_tok|decode_step_ms_median |decode_device|extend_step|elapsed|Error|error"; }
T="--num-prompts 256 --input-len 512 --output-len 256"
# first: a profiled throughput run (also compiles every kernel into Triton's disk cache)
echo "== profiled run, chunk 256, steps 300-304" >> "$OUT/log.txt"
timeout 150 $B $T --max-num-batched-tokens 256 --profile-steps 300 5 --profile-out "$OUT/prof_extend.txt" \
  --output-json /tmp/prof_run.json 2>&1 | show >> "$OUT/log.txt"
for mode in off auto; do
  echo "== decode bs1 ctx1k skinny=$mode" >> "$OUT/log.txt"
  GEARSHIFT_SKINNY_GEMM=$mode timeout 120 $B --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$OUT/decode_bs1_$mode.json" 2>&1 | show >> "$OUT/log.txt"
done
for c in 256 512; do
  echo "== throughput chunk $c skinny=auto" >> "$OUT/log.txt"
  timeout 150 $B $T --max-num-batched-tokens $c --output-json "$OUT/thr${c}.json" 2>&1 | show >> "$OUT/log.txt"
done
echo "== profiled run, chunk 256, steps 700-704 (decode at batch 64)" >> "$OUT/log.txt"
timeout 150 $B $T --max-num-batched-tokens 256 --profile-steps 700 5 --profile-out "$OUT/prof_decode.txt" \
  --output-json /tmp/prof_run2.json 2>&1 | show >> "$OUT/log.txt"
python - "$OUT" >> "$OUT/log.txt" <<'PY'
import json, sys
for f in ("decode_bs1_auto.json", "thr256.json"):
    d = json.load(open(f"{sys.argv[1]}/{f}"))
    for r in d.get("skinny_gemm", {}).get("shapes", []):
        print(f, r["rows"], r["n"], r["k"], r["choice"], {k: round(v * 1e3, 1) for k, v in r["ms"].items()})
PY
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
