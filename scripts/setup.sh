#!/usr/bin/env bash
# Installs what strata needs to build and test (Debian packages only), then configures and builds
# into build/. Idempotent: installs only what is missing; rebuilds incrementally.
#
#   scripts/setup.sh          everything: the CLI, the CUDA backend where nvcc is found, the
#                             benchmarks and the tests (scripts/test.sh)
#   scripts/setup.sh cli      the CLI alone (build/strata), for scripts/demo.sh: a build/ made
#                             here leaves the CUDA backend out; one already configured keeps its
#                             options
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in
  all|cli) ;;
  *) echo "usage: scripts/setup.sh [all|cli]" >&2; exit 2 ;;
esac
# shellcheck source=packages.sh
. scripts/packages.sh
install_missing_packages
if [ "$what" = cli ]; then
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF > build.log 2>&1 ||
      { cat build.log; exit 1; }
  fi
  cmake --build build -j"$(nproc)" --target strata >> build.log 2>&1 || { tail -50 build.log; exit 1; }
else
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON > build.log 2>&1 ||
    { cat build.log; exit 1; }
  cmake --build build -j"$(nproc)" >> build.log 2>&1 || { tail -50 build.log; exit 1; }
fi
