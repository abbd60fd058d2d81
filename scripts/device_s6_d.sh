#!/usr/bin/env bash
# Session 6, call D: the same sweep as call C on the same code (a second sample: the noise between two
# identical configurations reached 3-7% per pass at c = 8 in call C), on
# ONE tree-capable engine (K = 4, width 4, 16 nodes). Saves after every point.
# Usage (device tool): bash scripts/device_s6_d.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
echo "sweep budget: $((585 - SECONDS)) s" >> "$OUT/log.txt"
timeout $((585 - SECONDS)) $G bench sweep --model /tmp/big --draft-model /tmp/bighead --rounds 5 \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
echo "sweep rc $?" >> "$OUT/log.txt"
grep -v "it/s\]" "$OUT/sweep.log" | tail -4 | cut -c1-200 >> "$OUT/log.txt"
python scripts/sweep_table.py "$OUT/sweep.json" --png "$OUT/sweep_table.png" >> "$OUT/log.txt" 2>&1
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
