#!/usr/bin/env bash
# Installs what strata needs to build and test (Debian packages only), then configures and builds.
# Idempotent: installs only what is missing; rebuilds incrementally.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(cmake g++ make libopenmpi-dev openmpi-bin libdnnl-dev nlohmann-json3-dev libcli11-dev
          libgtest-dev iproute2 python3 libpcre2-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" >> build.log 2>&1 || { tail -50 build.log; exit 1; }
