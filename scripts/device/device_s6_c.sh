#!/usr/bin/env bash
# Session 6, call C: the full sweep again (5 rounds per point) after call B's findings
# (tree gain from population evidence, cheaper planning, VERIFY cost incl. planning), on
# ONE tree-capable engine (K = 4, width 4, 16 nodes): call B's script with --rounds 5.
# Usage (device tool): bash scripts/device/device_s6_c.sh
SWEEP_ARGS="--rounds 5" exec bash "$(dirname "$0")/device_s6_b.sh"
