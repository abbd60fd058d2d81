#!/usr/bin/env bash
# Ran at commit 29f2f6e; the experiment's script and kernel code were removed after it.
# Session 20, call F: the decode kernel with each block's slots read one iteration ahead
# (slots_ahead: the K/V gathers double-buffered by Triton's pipeliner).
# (1) scripts/bench_decode_ahead.py; (2) offline, alternating: today's kernel against the
# microbenchmark's fastest batch-64 config (GEARSHIFT_DECODE_SLOTS_AHEAD=<n>x<warps>x<stages>).
# Usage (device tool): bash scripts/device/device_s20_f.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
timeout 150 python scripts/bench_decode_ahead.py --out "$OUT/decode_ahead.json" >> "$OUT/log.txt" 2>&1 \
  || echo "bench rc $?" >> "$OUT/log.txt"
BEST=$(python - "$OUT/decode_ahead.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["cases"]["batch64_ctx640"]
best = min((r for r in rows if r["slots_ahead"]), key=lambda r: r["us"])
print("x".join(map(str, best["blocks"])))
PY
)
echo "slots-ahead blocks: $BEST" >> "$OUT/log.txt"
for i in 1 2; do
  offline_run "base $i" base$i
  GEARSHIFT_DECODE_SLOTS_AHEAD=$BEST offline_run "slots ahead $i" ahead$i
done
rm -f "$OUT"/tb_*2.json
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
