#!/usr/bin/env bash
# Session 6, call B: the full sweep on ONE tree-capable engine (K = 4, width 4, 16 nodes):
# every policy interleaved, goodput choosing among chains, the tree and plain decode. The
# sweep saves after every point, so a cut run keeps what it measured. SWEEP_ARGS adds flags
# (calls C and D: --rounds 5). END: the second of the call by which the sweep must stop
# (default 585; a script that ran other things first passes what is left).
# Usage (device tool): bash scripts/device/device_s6_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/log.txt"
if [ ! -f /tmp/bighead/config.json ]; then  # an earlier call on this (warm) machine built it
  timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
    --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
    > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
fi
END=${END:-585}
echo "sweep budget: $((END - SECONDS)) s" >> "$OUT/log.txt"
timeout $((END - SECONDS)) $G bench sweep --model /tmp/big --draft-model /tmp/bighead ${SWEEP_ARGS:-} \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
echo "sweep rc $?" >> "$OUT/log.txt"
grep -v "it/s\]" "$OUT/sweep.log" | tail -4 | cut -c1-200 >> "$OUT/log.txt"
python scripts/sweep_table.py "$OUT/sweep.json" --png "$OUT/sweep_table.png" >> "$OUT/log.txt" 2>&1
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
