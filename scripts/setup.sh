#!/usr/bin/env bash
# Installs what strata needs to build and test (Debian packages only), then configures and builds.
# Idempotent: installs only what is missing; rebuilds incrementally.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=packages.sh
. scripts/packages.sh
install_missing_packages
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" >> build.log 2>&1 || { tail -50 build.log; exit 1; }
