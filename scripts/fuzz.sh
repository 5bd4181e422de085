#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined sanitizers) and runs each for a
# bounded time on a seed corpus made from data/. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCPSIM_BUILD_FUZZERS=ON -DCPSIM_ENABLE_CUDA=OFF -DCPSIM_BUILD_TESTS=OFF \
  -DCPSIM_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target cpsim_fuzz_loaders
corpus=build-fuzz/corpus
rm -rf "$corpus" && mkdir -p "$corpus"
# Seeds: selector byte (0 HF config, 1 profile, 2 recipe, 3 length) + a real file.
i=0
for f in data/models/*.json; do { printf '\x00'; cat "$f"; } >"$corpus/seed$((i++))"; done
for f in data/hardware/*.json; do { printf '\x01'; cat "$f"; } >"$corpus/seed$((i++))"; done
for f in data/recipes/*.json; do { printf '\x02'; cat "$f"; } >"$corpus/seed$((i++))"; done
for l in 131072 128K 3M 1G 0x10 -5; do { printf '\x03'; printf '%s' "$l"; } >"$corpus/seed$((i++))"; done
echo "fuzz: cpsim_fuzz_loaders for ${seconds}s on $i seeds"
ASAN_OPTIONS=detect_leaks=1 ./build-fuzz/tests/fuzz/cpsim_fuzz_loaders "$corpus" \
  -max_total_time="$seconds" -max_len=65536 -timeout=10 -print_final_stats=1 2>&1 | tail -15
