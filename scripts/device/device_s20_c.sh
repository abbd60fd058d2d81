#!/usr/bin/env bash
# Ran at commit b1c4451; the experiment's scripts and kernel code were removed after it.
# Session 20, call C: (1) the extend kernel's decoder path, key block x pipeline depth, with
# each variant's registers / shared memory (scripts/bench_extend_decoders.py); (2) the SM and
# memory clocks and power through an offline run (nvidia-smi every 100 ms): do the
# GEMM-heavy mixed steps run at lower clocks than the microbenchmarks?
# Usage (device tool): bash scripts/device/device_s20_c.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
timeout 200 python scripts/bench_extend_decoders.py --out "$OUT/extend_decoders.json" >> "$OUT/log.txt" 2>&1 \
  || echo "bench rc $?" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$OUT/smi.csv" 2>&1 &
SMI=$!
offline_run "with clock sampling" clocks
kill $SMI
python - "$OUT/smi.csv" >> "$OUT/log.txt" <<'PY'
import collections, sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
def num(x): return float(x.split()[0]) if x.split()[0].replace(".", "").isdigit() else None
busy = [r for r in rows if num(r[3]) and num(r[3]) > 250]  # samples under load
print(f"{len(rows)} samples, {len(busy)} above 250 W")
for label, col in (("sm MHz", 1), ("mem MHz", 2), ("W", 3), ("C", 4)):
    v = sorted(num(r[col]) for r in busy if num(r[col]) is not None)
    if v: print(label, "min", v[0], "p10", v[len(v)//10], "median", v[len(v)//2], "max", v[-1])
print("throttle reasons", collections.Counter(r[5].strip() for r in busy).most_common(5))
PY
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
