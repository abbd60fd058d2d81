#!/usr/bin/env bash
# Every headline figure of docs/benchmarks.md, measured on the current commit in ONE device
# call of at most 10 minutes on one H200. From the repository root:
#
#     OUT=out bash benchmarks/h200.sh        # JSON, logs and the sweep's PNG under $OUT
#     OUT=out STEPS="pair mixed" bash benchmarks/h200.sh   # a second call: the mixed workload
#     OUT=out STEPS="pair transition" bash benchmarks/h200.sh   # a third: the transition workload
#     python benchmarks/report.py out        # -> docs/benchmarks.md + docs/spec_sweep.png
#
# H200_SMOKE=1 runs the same steps on the CPU at toy sizes (a widened copy of the embedded
# default model, a few tokens): tests/unit/test_benchmarks_h200.py runs it so this cannot rot.
# COMMIT=<hash> names the commit where the device's copy of the tree has no .git; STEPS picks
# steps (default: all). The step machinery is benchmarks/steps.sh, shared with h200_*.sh.
#
# Steps, each with its own timeout (cap), none past END (580 s; a step that ignores its
# SIGTERM is killed 10 s later) so the call ends within its 10 minutes.
# Estimates come from earlier H200 runs of the same commands:
#   step          what                                                      estimate  cap
#   pair          make-bench-model: the 8B-shaped bench target (16 GB on       45 s   80 s
#                 /tmp) and its EAGLE-3 head; skipped when $PAIR holds them
#   decode_plain  decode step at batch 1, 32, 128 (1k context, 128 output;     85 s  130 s
#                 llama-3.1-8b preset, dummy bf16 weights, no draft): the
#                 first engine of the call, so Triton compiles and the GEMM
#                 chooser's timings land here (~60 s start-up), ~8 s of steps
#   decode_draft  the same with the bench head configured at spec_policy off   40 s   80 s
#                 (warm compile cache; no speculation warm-up at policy off)
#   offline       256 prompts x 512 in / 256 out, <= 64 running, step budget   30 s   70 s
#                 512: ~10 s start-up, ~9 s timed run
#   sweep         8 policies at c = 1, 8, 64, 256, 2 rounds x 2 passes        270 s  the rest
#                 (>= 8 requests a point): ~75 s start-up (load 16 GB, graphs,   (>= 220 s)
#                 speculation warm-up at 256 sequences), ~10 s settling at
#                 c = 1, ~35 s of untimed warm-ups before the points, ~125 s timed
#   total                                                                   ~440 s  580 s
#   mixed         (its own call) the same policies on --workload mixed: half   330 s  the rest
#                 greedy, half sampled at T 1.2, at c = 1, 8, 32, 64, 256
#   transition    (its own call) goodput against off, always-2, always-4 on  200 s  the rest
#                 --workload transition (code, random words, code) at c = 1
#                 and 8, each phase two request sets per slot
# The sweeps save after each concurrency, so a cut sweep keeps its first points.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
STEPS=${STEPS:-pair decode_plain decode_draft offline sweep}
: > "$OUT/steps.jsonl"

if [ "$SMOKE" = 1 ]; then
  smoke_pair
  MODEL=(--preset "$SHAPE" --load-format dummy)
  DECODE=(--batch-sizes 1,2,4 --input-len 16 --output-len 8)
  OFFLINE=(--max-num-seqs 4 --num-prompts 6 --input-len 16 --output-len 8 --max-num-batched-tokens 32)
  SWEEP=(--concurrency 1,2 --rounds 1 --passes 2 --min-requests 2 --settle 0 --input-len 8
         --output-len 6 --tree-width 2 --tree-budget 4)
  MIXED=(--concurrency 1,2 --rounds 1 --passes 2 --min-requests 2 --settle 0 --input-len 8
         --output-len 6 --tree-width 2 --tree-budget 4)
  TRANSITION=(--concurrency 1,2 --max-num-seqs 2 --rounds 1 --passes 2 --min-requests 2 --settle 0
              --input-len 8 --output-len 6 --tree-width 2 --tree-budget 4)
else
  MODEL=(--preset llama-3.1-8b --load-format dummy)
  DECODE=(--batch-sizes 1,32,128 --input-len 1024 --output-len 128)
  OFFLINE=(--max-num-seqs 64 --num-prompts 256 --input-len 512 --output-len 256
           --max-num-batched-tokens 512)
  SWEEP=(--concurrency 1,8,64,256 --rounds 2 --passes 2 --min-requests 8)
  MIXED=(--concurrency 1,8,32,64,256 --rounds 2 --passes 2 --min-requests 8)
  TRANSITION=(--concurrency 1,8 --max-num-seqs 8 --rounds 2 --passes 2 --min-requests 8)
fi
# every policy, goodput with a K per request (goodput-request) included
POLICIES=(--policies goodput,goodput-request,off,always-2,always-4,threshold,threshold-vllm,tree)

write_meta "$OUT/meta.json"

pair_step
run_step decode_plain 130 "${G[@]}" bench offline "${MODEL[@]}" "${DECODE[@]}" \
  --output-json "$OUT/decode_plain.json"
run_step decode_draft 80 "${G[@]}" bench offline "${MODEL[@]}" "${DECODE[@]}" \
  --speculative-algorithm eagle3 --draft-model "$PAIR/head" --spec-policy off \
  --output-json "$OUT/decode_draft.json"
run_step offline 70 "${G[@]}" bench offline "${MODEL[@]}" "${OFFLINE[@]}" \
  --output-json "$OUT/offline.json"
run_step sweep $((END - SECONDS)) "${G[@]}" bench sweep --model "$PAIR/target" \
  --draft-model "$PAIR/head" "${SWEEP[@]}" "${POLICIES[@]}" \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png"
run_step mixed $((END - SECONDS)) "${G[@]}" bench sweep --model "$PAIR/target" \
  --draft-model "$PAIR/head" "${MIXED[@]}" "${POLICIES[@]}" --workload mixed \
  --output-json "$OUT/mixed.json" --output-png "$OUT/mixed.png"
run_step transition $((END - SECONDS)) "${G[@]}" bench sweep --model "$PAIR/target" \
  --draft-model "$PAIR/head" "${TRANSITION[@]}" --workload transition \
  --policies goodput,off,always-2,always-4 --output-json "$OUT/transition.json"

# a preview of the page from what came back (the real one: python benchmarks/report.py OUT)
python benchmarks/report.py "$OUT" --output "$OUT/benchmarks.md" || FAILED=$((FAILED + 1))
echo "[h200] done in $SECONDS s, $FAILED step(s) failed; page preview: $OUT/benchmarks.md"
(( FAILED == 0 ))
