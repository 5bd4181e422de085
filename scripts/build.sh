#!/usr/bin/env bash
# Installs dependencies (Debian packages) if missing, then configures and builds into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPSIM_WERROR="${CPSIM_WERROR:-OFF}" \
  -DCPSIM_ENABLE_CUDA="${CPSIM_ENABLE_CUDA:-AUTO}"
cmake --build build -j"$(nproc)"
