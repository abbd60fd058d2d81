#!/usr/bin/env bash
# Session 8, call F: the focus sweep (8 passes) at c = 2, 4, 128, 256 after goodput began
# pricing the draft's catch-up (call E: goodput lost 5% to off at c = 256, its probes after
# long plain stretches took 47-53 ms) and its c <= 4 points in call D.
# Usage (device tool): bash scripts/device/device_s8_f.sh
set -uo pipefail
END=${END:-420} CONC=${CONC:-2,4,128,256} PASSES=${PASSES:-8} bash scripts/device/device_focus.sh
