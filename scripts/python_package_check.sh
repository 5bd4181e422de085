#!/usr/bin/env bash
# The Python package as a user installs it: `pip install .` into a fresh venv (scikit-build-core
# builds the extension from this checkout; every package pinned by requirements.txt as a
# constraint), then the import from outside the source tree and the Python API's tests against the
# installed copy. Usage: scripts/python_package_check.sh [VENV_DIR] (default: a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
venv="${1:-$(mktemp -d)/venv}"
python="${CPSIM_VENV_PYTHON:-python3}"
"$python" -m venv "$venv"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# Build isolation takes scikit-build-core and nanobind at pyproject.toml's pins; pandas and pytest
# for the tests at requirements.txt's.
"$venv/bin/python" -m pip install --quiet --no-input -c requirements.txt . pandas pytest \
  2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory." >&2)
cd "$(mktemp -d)"
"$venv/bin/python" -c "import cpsim; print(cpsim.maxlen(model='llama3-8b', gpus=8, method='upipe'))"
CPSIM_BIN="$root/build/cpsim" CPSIM_INSTALLED=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$root/tests/python"
