#!/usr/bin/env bash
# Session 16, call D: PDL with the long kernels (GEMMs, decode attention) triggering after
# their main loop, prefetch 2 stages, against PDL off: batch-1 decode twice each, then
# offline (budget 512) off / on. Same runs as call C, other variants.
# Usage (device tool): bash scripts/device/device_s16_d.sh
BS1_VARIANTS="off:2 on:2 off:2 on:2" OFFLINE_VARIANTS="off:1 on:2" \
  exec bash "$(dirname "$0")/device_s16_c.sh"
