#!/usr/bin/env bash
# strata plan's step-time model checked here: calibrate this machine at the probe model's shapes,
# fit the step's overheads on the probe at 4 and 8 ranks, then verify on two models it was not
# fitted on, each calibrated at its own shapes (the fits carry over).
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
# At the probe's shapes (its GEMMs, both families' block kernels, attention at its lengths).
$B launch -n 2 -- bench --calibrate --config configs/plan/cpu_probe.json --output "$cal"
for n in 4 8; do
  echo "== fit cpu_probe n=$n"
  $B plan --config configs/plan/cpu_probe.json --devices "$n" --device cpu --calibration "$cal" \
    --fit 16 --verify-steps 6
done
for cfg in cpu_gpt2_small cpu_llama_small; do
  # Each model's own shapes; the file keeps the fits above (same CPU).
  $B launch -n 2 -- bench --calibrate --config "configs/plan/$cfg.json" --output "$cal"
  for n in 4 8; do
    echo "== verify $cfg n=$n"
    $B plan --config "configs/plan/$cfg.json" --devices "$n" --device cpu --calibration "$cal" \
      --verify 6 --verify-steps 6
  done
done
