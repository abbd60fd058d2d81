#!/usr/bin/env bash
# Prepared in session 19 for the next session, call A: the skinny chooser timing each
# candidate in context (GEARSHIFT_SKINNY_TIMING=context: after kernels/evict.py's PDL
# kernel, 3% margin) against the default (after flush.sum(), 10% margin under PDL, session
# 19's change). GPU skinny-GEMM tests (stream_sum on the GPU), then batch 1 and offline,
# alternating, two pairs; each run's JSON holds the chooser's picks and timings.
# Usage (device tool): bash scripts/device/device_s20_a.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
GEARSHIFT_SKINNY_TIMING=context bs1_run "context" context
bs1_run "alone" alone
for i in 1 2; do
  GEARSHIFT_SKINNY_TIMING=context offline_run "context $i" context$i
  offline_run "alone $i" alone$i
done
python - "$OUT" >> "$OUT/log.txt" <<'PY'
import json, sys
for tag in ("context1", "alone1"):
    rows = json.load(open(f"{sys.argv[1]}/tb_{tag}.json"))["skinny_gemm"]
    print(tag, [(r["rows"], r["n"], r["k"], r["kind"], r["choice"]) for r in rows if r["rows"] == 64])
PY
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
