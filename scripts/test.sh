#!/usr/bin/env bash
# The test suite: installs what is missing, builds, runs every test (ctest, incl. the golden
# test against PyTorch fixtures and the bad-input tests through the CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
cd build && ctest --output-on-failure --timeout 600 -j1
