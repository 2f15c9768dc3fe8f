#!/usr/bin/env bash
# strata plan's step-time model checked here: calibrate this machine, fit the step's overheads on
# the probe model at 4 and 8 ranks, then verify on two models it was not fitted on.
# Usage: bench/plan_fit.sh [BUILD_DIR] > bench/results_plan_fit_<date>.txt  (machine idle)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=$(cd "${1:-build}" && pwd)/strata
cd "$here/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
machine_info --strata "$B" --layout "4 and 8 ranks on the host's cores"
cal=$(mktemp /tmp/strata_cal_XXXXXX.json)
$B launch -n 2 -- bench --calibrate --output "$cal"
for n in 4 8; do
  echo "== fit cpu_probe n=$n"
  $B plan --config configs/plan/cpu_probe.json --devices "$n" --device cpu --calibration "$cal" \
    --fit 16 --verify-steps 8
done
for cfg in cpu_gpt2_small cpu_llama_small; do
  for n in 4 8; do
    echo "== verify $cfg n=$n"
    $B plan --config "configs/plan/$cfg.json" --devices "$n" --device cpu --calibration "$cal" \
      --verify 6 --verify-steps 8
  done
done
