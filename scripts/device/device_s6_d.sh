#!/usr/bin/env bash
# Session 6, call D: call C again on the same code, a second sample (two identical
# configurations differed by 3-7% per pass at c = 8 in call C).
# Usage (device tool): bash scripts/device/device_s6_d.sh
exec bash "$(dirname "$0")/device_s6_c.sh"
