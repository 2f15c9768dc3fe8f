#!/usr/bin/env bash
# The demo: installs what is missing, builds, and trains the demo model with the seed config on
# the licence texts of /usr/share/common-licenses (tokenized byte-level; nothing is downloaded),
# data-parallel on 4 local ranks with ZeRO stage 3 through `strata launch` (mpirun underneath).
# It builds the CLI alone (no CUDA backend, no tests: those are scripts/test.sh's to build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cli
build/strata launch -n "${RANKS:-4}" -- train --config configs/seed_ds_config.json \
  --run-dir runs/demo "$@"
