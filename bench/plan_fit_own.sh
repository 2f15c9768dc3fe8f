#!/usr/bin/env bash
# strata plan as a user runs it: for each model, calibrate this machine at the model's shapes, fit
# the step's overheads on probe layouts of that model (--fit 16, spread over its whole ranking,
# half at half the batch), then verify the top 6 rows and every 4th of the next 24 (--verify 6),
# at 4 and 8 ranks. bench/plan_fit.sh checks the harder case: a fit carried to other models.
# Usage: bench/plan_fit_own.sh [BUILD_DIR] > bench/results_plan_fit_own_<date>.txt  (machine idle)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=$(cd "${1:-build}" && pwd)/strata
cd "$here/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
machine_info --strata "$B" --layout "4 and 8 ranks on the host's cores"
for cfg in cpu_gpt2_small cpu_llama_small; do
  cal=$(mktemp /tmp/strata_cal_XXXXXX.json)
  $B launch -n 2 -- bench --calibrate --config "configs/plan/$cfg.json" --output "$cal"
  for n in 4 8; do
    echo "== fit and verify $cfg n=$n"
    $B plan --config "configs/plan/$cfg.json" --devices "$n" --device cpu --calibration "$cal" \
      --fit 16 --verify 6 --verify-steps 6
  done
  rm -f "$cal"
done
