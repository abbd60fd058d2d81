#!/usr/bin/env bash
# Session 3: decode at batch 1 with the fused vs separate decode-attention merge (issue 2),
# then on the 8B-shaped bench pair: `bench sweep` over the chain policies and `bench burst`.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
B="python -m gearshift.bench.offline --preset llama-3.1-8b --load-format dummy"
for m in separate fused; do
  GEARSHIFT_DECODE_MERGE=$m timeout 60 $B --max-num-seqs 1 --num-prompts 1 --input-len 1024 \
    --output-len 128 --output-json "$OUT/decode_bs1_$m.json" > "$OUT/decode_bs1_$m.txt" 2>&1
  python -c "import json,sys; d=json.load(open('$OUT/decode_bs1_$m.json')); r=d.get('results', d); print('$m', {k: v for k, v in r.items() if 'decode' in k and not isinstance(v, (list, dict))})"
done
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-260} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --policies ${POLICIES:-goodput,off,always-2,always-4,threshold,threshold-vllm} \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
grep -v "it/s\]" "$OUT/sweep.txt" | tail -3 | cut -c1-200
timeout ${BURST_TIMEOUT:-110} $G bench burst --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/burst.json" > "$OUT/burst.txt" 2>&1; grep -v "it/s\]" "$OUT/burst.txt" | tail -8
