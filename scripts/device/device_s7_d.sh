#!/usr/bin/env bash
# Session 7, call D: the lower half of the sweep (c = 1..16, 4 passes) on call C's code.
# Usage (device tool): bash scripts/device/device_s7_d.sh
SWEEP_ARGS="--rounds 5 --passes 4 --concurrency 1,2,4,8,16" \
  exec bash "$(dirname "$0")/device_s6_b.sh"
