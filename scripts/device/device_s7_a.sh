#!/usr/bin/env bash
# Session 7, call A: the upper half of the sweep (c = 32..256) with 4 passes per point
# (session 6: two passes could not settle 3%; identical configurations differed by up to
# 7.5% per pass). Each half makes the bench pair and warms up on its own.
# Usage (device tool): bash scripts/device/device_s7_a.sh
SWEEP_ARGS="--rounds 5 --passes 4 --concurrency 32,64,128,256" \
  exec bash "$(dirname "$0")/device_s6_b.sh"
