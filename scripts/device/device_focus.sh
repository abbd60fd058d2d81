#!/usr/bin/env bash
# A confirmation sweep (`bench sweep --focus`): at each concurrency, goodput and only the
# FOCUS_TOP (3) policies closest to the best in the earlier H200 sweeps (session 6 calls
# C, D; session 7 A+B, C+D), with PASSES (8) passes: issue 4's per-point verdict from
# more samples of the comparisons that decide it; a pass runs c * ROUNDS (1) requests
# (sessions 8-9 call B: 5c/8, see sweep.per_pass). CONC picks the half (one call each:
# with 5c requests per point, as then, "1,2,4,8,16" took ~3 min and "32,64,128,256" ~4 min;
# the default 8c per point takes ~1.6x as long).
# Usage (device tool): CONC=1,2,4,8,16 bash scripts/device/device_focus.sh (END: the second of the
# call by which the sweep must stop, default 585)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
D=docs/benchmarks
# PRIOR: the screening sweeps (comma-separated). Session 10: the sweeps at real concurrency
# (session 9 C + D, session 10 A + B), not sessions 6-7's (their passes never reached c)
if [ -z "${PRIOR:-}" ]; then
  PRIOR=$D/2026-11-30-h200-session6/c/sweep.json,$D/2026-11-30-h200-session6/d/sweep.json
  PRIOR=$PRIOR,$D/2026-11-30-h200-session7/combined_ba.json,$D/2026-11-30-h200-session7/combined_dc.json
fi
date -u +%FT%TZ > "$OUT/log.txt"
if [ ! -f /tmp/bighead/config.json ]; then  # an earlier script of this call may have built it
  timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
    --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
    > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
fi
END=${END:-585}
echo "sweep budget: $((END - SECONDS)) s" >> "$OUT/log.txt"
timeout $((END - SECONDS)) $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --rounds "${ROUNDS:-1}" --passes "${PASSES:-8}" --concurrency "${CONC:-1,2,4,8,16}" \
  --focus "$PRIOR" --focus-top "${FOCUS_TOP:-3}" \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
echo "sweep rc $?" >> "$OUT/log.txt"
python scripts/sweep_table.py "$OUT/sweep.json" >> "$OUT/log.txt" 2>&1
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
