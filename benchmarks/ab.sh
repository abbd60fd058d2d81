#!/usr/bin/env bash
# A/B of this checkout against another tree of the code, in one device call: the engine's
# closed loop (`bench sweep`, step-traced) on the bench pair, run with each tree in turn.
# Speeds compare only within one lease, so both sides run on the same warm machine. From
# the repository root, with the other tree prepared here and carried to the device:
#
#     git archive OLD_COMMIT gearshift | tar -x -C .lab/old     # .lab is git-ignored
#     OUT=out OLD=.lab/old bash benchmarks/ab.sh                # carry: [".lab"]
#     -> $OUT/ab.md: output tok/s per point, new / old, VERIFY step wall and host time
#
# OLD: the other tree's root (its gearshift/ package; the package data it lacks, presets and
# the default model, are copied in from this checkout). CONC and POLICIES: the points
# (default c = 1, 32; goodput); TREE_WIDTH: the draft tree width (default 1: chains;
# "engine": the engine's default, trees on, as h200.sh's sweep); SIDES: the order (default
# "new old": the first side also pays the call's kernel compiles, so swap it to check).
# H200_SMOKE=1: the smoke pair on the CPU (tests/unit/test_benchmarks_ab.py). Step
# machinery: benchmarks/steps.sh.
#
#   step       what                                                       cap
#   pair       the bench pair, as h200.sh (skipped when $PAIR holds it)    80 s
#   ab_SIDE    bench sweep with that side's code: ~90 s of start-up (the     the rest,
#              8B pair's warm-up), then the points, traced                 halved
set -uo pipefail
source "$(dirname "$0")/steps.sh"
STEPS=${STEPS:-pair ab}
: "${OLD:?set OLD to the other tree (a folder holding its gearshift/ package)}"
OLD=$(cd "$OLD" && pwd)
[ -d "$OLD/gearshift" ] || { echo "$OLD has no gearshift/ package"; exit 2; }
: > "$OUT/steps.jsonl"

if [ "$SMOKE" = 1 ]; then
  smoke_pair
  POINT=(--rounds 1 --passes 1 --min-requests 2 --settle 0 --input-len 16 --output-len 8)
  CONC=${CONC:-1,2}
else
  POINT=(--rounds 2 --passes 2 --min-requests 8 --input-len 128 --output-len 128)
  CONC=${CONC:-1,32}
fi
POLICIES=${POLICIES:-goodput}
TREE=(--tree-width "${TREE_WIDTH:-1}")
[ "${TREE_WIDTH:-1}" = engine ] && TREE=()
write_meta "$OUT/meta.json"
for data in presets default_model; do  # a `git archive` of .py files lacks them
  [ -e "$OLD/gearshift/$data" ] || cp -r "gearshift/$data" "$OLD/gearshift/"
done

pair_step
if wanted ab; then
  read -ra sides <<< "${SIDES:-new old}"
  for i in "${!sides[@]}"; do
    side=${sides[$i]} root=$PWD
    [ "$side" = old ] && root=$OLD
    # each side gets an equal share of what is left; -P: the working directory (this
    # checkout's root) must not come before the side's tree on sys.path
    step "ab_$side" $(((END - SECONDS) / (${#sides[@]} - i))) \
      env PYTHONPATH="$root" python -P -m gearshift.cli bench sweep --model "$PAIR/target" \
      --draft-model "$PAIR/head" --concurrency "$CONC" --policies "$POLICIES" "${TREE[@]}" \
      "${POINT[@]}" --step-trace "$OUT/trace_$side.jsonl" --output-json "$OUT/ab_$side.json"
  done
fi
python benchmarks/ab_report.py "$OUT" > "$OUT/ab.md" || FAILED=$((FAILED + 1))
cat "$OUT/ab.md"
exit $((FAILED > 0))
