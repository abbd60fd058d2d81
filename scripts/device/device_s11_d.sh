#!/usr/bin/env bash
# Session 11, calls D and E: a confirmation sweep of goodput with steady gears kept unscored
# (rescore_every) and the tree judged on ~30 tree steps at batch 1 (tree_evidence 100): at
# each c goodput and the 3 policies closest to the best in the sweeps at real concurrency
# (session 9 C + D, session 10 A + B, session 11 A + B); a settle pass first. Usage (device tool):
#   CONC=1,2,4,8,16 PASSES=8 bash scripts/device/device_s11_d.sh
#   CONC=32,64,128,256 PASSES=2 END=330 bash scripts/device/device_s11_d.sh
D=docs/benchmarks
PRIOR=$D/2026-11-30-h200-session9/combined_dc.json,$D/2026-11-30-h200-session10/all.json
PRIOR=$PRIOR,$D/2026-11-30-h200-session11/all.json \
  ROUNDS=${ROUNDS:-3} FOCUS_TOP=3 exec bash "$(dirname "$0")/device_focus.sh"
