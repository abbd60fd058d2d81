#!/usr/bin/env bash
# Session 2 baseline in one device call: kernel breakdown of decode steps (batch 1 and 64,
# 8B preset, dummy bf16), then the 8B-shaped bench pair (trained default target + head
# widened) and `gearshift bench sweep` over it with the code as it stands.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for bs in 1 64; do
  timeout 100 python scripts/profile_decode.py --batch-size $bs --context 640 \
    --out "$OUT/profile_bs$bs.txt" > /dev/null 2> "$OUT/profile_bs$bs.err"
  head -25 "$OUT/profile_bs$bs.txt" | cut -c1-60,100-160
done
t0=$(date +%s)
timeout 150 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -3 "$OUT/make_bench.txt"
echo "make-bench-model: $(( $(date +%s) - t0 )) s"
timeout 330 $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
tail -30 "$OUT/sweep.txt"
