#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined sanitizers) and runs each for a
# bounded time on a seed corpus made from data/ and tests/fuzz/seeds/. Usage:
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 30; CI: 20, i.e. about 1 minute of fuzzing)
# Targets (tests/fuzz/): cpsim_fuzz_loaders (HF config, profile, recipe, length),
# cpsim_fuzz_calibration (raw calibration file), cpsim_fuzz_validation (validation case).
# A crash leaves its input in build-fuzz/artifacts/; replay it with `./build-fuzz/tests/fuzz/TARGET
# FILE`. Exits 1 if any target finds a bug.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
targets=(cpsim_fuzz_loaders cpsim_fuzz_calibration cpsim_fuzz_validation)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCPSIM_BUILD_FUZZERS=ON -DCPSIM_ENABLE_CUDA=OFF -DCPSIM_BUILD_TESTS=OFF \
  -DCPSIM_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"

rm -rf build-fuzz/corpus build-fuzz/artifacts
mkdir -p build-fuzz/artifacts
seed() {  # seed TARGET NAME: stdin becomes one seed of TARGET's corpus
  mkdir -p "build-fuzz/corpus/$1"
  cat >"build-fuzz/corpus/$1/$2"
}
# cpsim_fuzz_loaders: selector byte (0 HF config, 1 profile, 2 recipe, 3 length) + a real file.
for f in data/models/*.json; do { printf '\x00'; cat "$f"; } | seed cpsim_fuzz_loaders "model-${f##*/}"; done
for f in data/hardware/*.json; do { printf '\x01'; cat "$f"; } | seed cpsim_fuzz_loaders "hw-${f##*/}"; done
for f in data/recipes/*.json; do { printf '\x02'; cat "$f"; } | seed cpsim_fuzz_loaders "recipe-${f##*/}"; done
for l in 131072 128K 3M 1G 0x10 -5; do printf '\x03%s' "$l" | seed cpsim_fuzz_loaders "len$l"; done
# cpsim_fuzz_calibration: the committed sample (one sample of every kind).
for f in tests/fuzz/seeds/calibration/*.json; do seed cpsim_fuzz_calibration "${f##*/}" <"$f"; done
# cpsim_fuzz_validation: every public case.
for f in data/validation/*.json; do seed cpsim_fuzz_validation "${f##*/}" <"$f"; done

failed=0
for t in "${targets[@]}"; do
  n=$(find "build-fuzz/corpus/$t" -type f | wc -l)
  echo "fuzz: $t for ${seconds}s on $n seeds"
  log="build-fuzz/$t.log"
  if ASAN_OPTIONS=detect_leaks=1 "./build-fuzz/tests/fuzz/$t" "build-fuzz/corpus/$t" \
    -dict=tests/fuzz/json.dict -artifact_prefix="build-fuzz/artifacts/$t-" \
    -max_total_time="$seconds" -max_len=65536 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" | sed 's/^/  /'
  else
    echo "fuzz: $t FAILED (full log: $log; input in build-fuzz/artifacts/)"
    tail -60 "$log"
    failed=1
  fi
done
exit "$failed"
