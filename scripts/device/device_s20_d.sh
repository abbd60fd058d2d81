#!/usr/bin/env bash
# Ran at commit b1c4451; the experiment's scripts and kernel code were removed after it.
# Session 20, call D: attention key loops with their loads issued by hand a block ahead
# (kernels/prefetch.py). (1) scripts/bench_extend_decoders.py: the extend kernel's decoder
# path and the decode kernel (RoPE inside, one split), prefetched or not, with registers
# and shared memory of each variant; (2) offline, alternating: today's kernels, the extend
# decoder path prefetched (GEARSHIFT_EXTEND_DEC_PREFETCH=1), and both that and the decode
# kernel prefetched at the microbenchmark's fastest batch-64 blocks
# (GEARSHIFT_DECODE_PREFETCH=<block_n>x<warps>); batch 1 with both.
# Usage (device tool): bash scripts/device/device_s20_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
timeout 200 python scripts/bench_extend_decoders.py --out "$OUT/prefetch_bench.json" >> "$OUT/log.txt" 2>&1 \
  || echo "bench rc $?" >> "$OUT/log.txt"
BEST=$(python - "$OUT/prefetch_bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["decode"]["batch64_ctx640"]
best = min((r for r in rows if r["prefetch"]), key=lambda r: r["us"])
print(f"{best['blocks'][0]}x{best['blocks'][1]}")
PY
)
echo "decode prefetch blocks: $BEST" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
for i in 1 2; do
  offline_run "base $i" base$i
  GEARSHIFT_EXTEND_DEC_PREFETCH=1 offline_run "extend prefetch $i" ext$i
  GEARSHIFT_EXTEND_DEC_PREFETCH=1 GEARSHIFT_DECODE_PREFETCH=$BEST offline_run "both prefetch $i" both$i
done
GEARSHIFT_EXTEND_DEC_PREFETCH=1 GEARSHIFT_DECODE_PREFETCH=$BEST bs1_run "both prefetch" both
rm -f "$OUT"/tb_*2.json "$OUT"/bs1_both.json  # the device returns few files
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
