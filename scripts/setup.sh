#!/usr/bin/env bash
# Installs what cpsim needs to build and test: the Debian packages, then the project's Python
# environment .venv from requirements.txt (every package pinned with ==). Idempotent: packages
# already installed and a venv made from the same requirements are left as they are. Run as root
# (or with sudo for apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libboost-graph-dev libeigen3-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-format clang libclang-rt-14-dev
  python3 python3-venv  # the venv below is made with the machine's Python 3.11
  chromium fonts-dejavu-core  # headless rendering of `cpsim report` pages in the tests
  libopenmpi-dev openmpi-bin  # `cpsim calibrate run --mpi` (optional at configure time) and its test
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} Debian packages already installed"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python environment. CPSIM_VENV_PYTHON picks the interpreter that makes it (default: python3,
# which must be 3.11: the CPU torch wheel on the machine's disk is built for it). The stamp holds
# the hash of requirements.txt the venv was made from; a changed file makes the venv anew.
venv=.venv
python="${CPSIM_VENV_PYTHON:-python3}"
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [[ -x $venv/bin/python && -f $venv/.requirements.sha256 &&
  "$(cat $venv/.requirements.sha256)" == "$want" ]]; then
  echo "setup: $venv up to date with requirements.txt"
  exit 0
fi
version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ $version != "3.11" ]]; then
  echo "setup: $python is Python $version; requirements.txt is pinned for 3.11 (set CPSIM_VENV_PYTHON)" >&2
  exit 1
fi
echo "setup: making $venv from requirements.txt with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
# (The machine's pip configuration names local package folders that may not exist; pip warns of each
# once per package, which says nothing here.)
"$venv/bin/python" -m pip install --quiet --no-input --require-virtualenv -r requirements.txt \
  2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory." >&2)
# Refuse a venv that pulled anything not pinned (a CUDA torch, say).
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md, re, sys
pins = {}
for line in open("requirements.txt"):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    if name in ("pip", "wheel"):
        continue
    version = dist.version.split("+")[0]
    if pins.get(name) != version:
        sys.exit(f"setup: {name} {dist.version} in .venv is not pinned in requirements.txt")
EOF
echo "$want" >"$venv/.requirements.sha256"
echo "setup: $venv ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
