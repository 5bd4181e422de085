#!/usr/bin/env bash
# Smoke run of the Google Benchmark programs (cpsim_bench_sim, cpsim_bench_planner) with a tiny
# time budget: both must run, exit 0 and write a readable JSON report. Timings are printed but never
# compared with tests/bench/baseline.json: CI machines differ. To compare, run
# `python3 scripts/bench_compare.py` on the baseline's machine. Usage: scripts/bench_smoke.sh [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
# Debian 12's Google Benchmark 1.7 takes the minimum time as a bare number of seconds.
.venv/bin/python scripts/bench_compare.py --build-dir "$build" --no-compare --min-time 0.01 --repetitions 1
