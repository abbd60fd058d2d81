#!/usr/bin/env bash
# Session 7, call C: the upper half of the sweep (c = 32..256, 4 passes) after the paired
# tree evidence, the fresh-neighbour gate, the padded split-K decision and the sweep's
# closed-loop warm-up; points record Triton compiles and the slowest steps.
# Usage (device tool): bash scripts/device/device_s7_c.sh
exec bash "$(dirname "$0")/device_s7_a.sh"
