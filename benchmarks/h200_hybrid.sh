#!/usr/bin/env bash
# The hybrid proposer's figures (eagle3+suffix: a proposer per request) against each proposer
# alone, on the 8B bench pair, in one device call of at most 10 minutes. From the root:
#
#     OUT=out bash benchmarks/h200_hybrid.sh     # JSON, logs and PNGs under $OUT
#
# Each step is one `bench sweep` engine comparing the policies hybrid (goodput picks the
# proposer and K per request), model-only (EAGLE-3 alone) and suffix-only on one workload;
# the bench prints hybrid / model-only and hybrid / the best single proposer per point.
# H200_SMOKE=1 runs the same steps on the CPU at toy sizes with h200.sh's smoke pair:
# tests/unit/test_benchmarks_h200_hybrid.py runs it so this cannot rot. COMMIT, END and STEPS
# as in h200.sh.
#
#   step           what                                                           cap
#   pair           the 8B-shaped bench pair, as h200.sh (skipped when held)        80 s
#   agentic        multi-turn edit loops whose answers copy their input,          170 s
#                  c = 1, 8 (criterion: hybrid >= 1.5 x model-only)
#   novel          corpus windows (uniform), c = 1, 8, 64 (hybrid >= 0.97 x       150 s
#                  model-only)
#   mixed_agentic  half agentic, half corpus windows, c = 8, 32 (hybrid >= 1.15   the rest
#                  x the best single proposer); 4 rounds: agentic requests finish
#                  early and their slots refill, where one round times the novel
#                  half's tail alone
set -uo pipefail
source "$(dirname "$0")/steps.sh"
STEPS=${STEPS:-pair agentic novel mixed_agentic}
: > "$OUT/steps.jsonl"

POLICIES=(--policies hybrid,model-only,suffix-only)
if [ "$SMOKE" = 1 ]; then
  smoke_pair
  SIZE=(--rounds 1 --passes 2 --min-requests 2 --settle 0 --input-len 16 --output-len 8)
  AGENTIC=(--concurrency 1,2); NOVEL=(--concurrency 1,2); MIXED=(--concurrency 2)
else
  SIZE=(--rounds 1 --passes 2 --min-requests 8 --output-len 256)
  AGENTIC=(--concurrency 1,8 --max-num-seqs 8); NOVEL=(--concurrency 1,8,64 --max-num-seqs 64)
  MIXED=(--concurrency 8,32 --max-num-seqs 32 --rounds 4)
fi
SWEEP=("${G[@]}" bench sweep --model "$PAIR/target" --draft-model "$PAIR/head"
       --speculative-algorithm eagle3+suffix "${SIZE[@]}" "${POLICIES[@]}")

write_meta "$OUT/meta.json"
pair_step
run_step agentic 170 "${SWEEP[@]}" "${AGENTIC[@]}" --workload agentic \
  --output-json "$OUT/agentic.json" --output-png "$OUT/agentic.png"
run_step novel 150 "${SWEEP[@]}" "${NOVEL[@]}" --workload uniform \
  --output-json "$OUT/novel.json" --output-png "$OUT/novel.png"
run_step mixed_agentic $((END - SECONDS)) "${SWEEP[@]}" "${MIXED[@]}" --workload mixed-agentic \
  --output-json "$OUT/mixed_agentic.json" --output-png "$OUT/mixed_agentic.png"
echo "[h200_hybrid] done in $SECONDS s, $FAILED step(s) failed"
exit "$FAILED"
