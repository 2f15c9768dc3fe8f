#!/usr/bin/env bash
# The demo: installs what is missing, builds, and trains the demo model with the seed config on
# the licence texts of /usr/share/common-licenses (tokenized byte-level; nothing is downloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
build/strata train --config configs/seed_ds_config.json --run-dir runs/demo "$@"
