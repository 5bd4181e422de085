#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, CLI end-to-end, benchmark smoke runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
