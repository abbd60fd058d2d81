#!/usr/bin/env bash
# Session 10, calls C and D: a confirmation sweep of the code the full sweep (calls A + B)
# measured, with more passes: at each c goodput and the 3 policies closest to the best in
# the sweeps at real concurrency (session 9 C + D, session 10 A + B); a settle pass first
# (sweep.settle). Usage (device tool):
#   CONC=1,2,4,8,16 PASSES=8 bash scripts/device/device_s10_c.sh
#   CONC=32,64,128,256 PASSES=4 bash scripts/device/device_s10_c.sh
D=docs/benchmarks
PRIOR=$D/2026-11-30-h200-session9/combined_dc.json,$D/2026-11-30-h200-session10/all.json \
  ROUNDS=${ROUNDS:-3} FOCUS_TOP=3 exec bash "$(dirname "$0")/device_focus.sh"
