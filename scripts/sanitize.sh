#!/usr/bin/env bash
# Builds everything with AddressSanitizer + UndefinedBehaviorSanitizer (CUDA off) and runs the
# unit and CLI tests under them. Warnings are not errors here: GCC 12 reports false
# maybe-uninitialized warnings inside libstdc++ under the sanitizers (the main build is -Werror).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCPSIM_ENABLE_CUDA=OFF \
  -DCPSIM_SANITIZE=address,undefined -DCPSIM_BUILD_BENCHMARKS=OFF -DCPSIM_WERROR=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -LE "gpu|tracer|launchers"
