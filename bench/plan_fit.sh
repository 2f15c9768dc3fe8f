#!/usr/bin/env bash
# strata plan's step-time model checked here, at 4 and 8 ranks (12 layouts a case: the top 6 rows
# and every 4th of the next 24):
#   default  calibrate this machine at the probe model's shapes, fit the step's overheads on the
#            probe (--fit 16), then verify on two models it was not fitted on, each calibrated at
#            its own shapes (the fits carry over);
#   --own    as a user runs it: each of the two models calibrated at its shapes, fitted (--fit 16,
#            probes over its whole ranking and its leading rows, a quarter at half the batch) and
#            verified on itself.
# Every probe and verified layout is run twice (--verify-repeats' default), in two passes.
# Usage: bench/plan_fit.sh [--own] [BUILD_DIR] > bench/results_plan_fit[_own]_<date>.txt  (idle)
set -euo pipefail
own=false
if [ "${1:-}" = --own ]; then own=true; shift; fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=$(cd "${1:-build}" && pwd)/strata
cd "$here/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
machine_info --strata "$B" --layout "4 and 8 ranks on the host's cores"
cal=$(mktemp /tmp/strata_cal_XXXXXX.json)
trap 'rm -f "$cal"' EXIT
# Calibrates at configs/plan/$1.json's shapes (its GEMMs, both families' block kernels, attention
# at its lengths); the file keeps the fits it holds (same CPU).
calibrate() { $B launch -n 2 -- bench --calibrate --config "configs/plan/$1.json" --output "$cal"; }
if ! $own; then
  calibrate cpu_probe
  for n in 4 8; do
    echo "== fit cpu_probe n=$n"
    $B plan --config configs/plan/cpu_probe.json --devices "$n" --device cpu --calibration "$cal" \
      --fit 16 --verify-steps 6
  done
fi
for cfg in cpu_gpt2_small cpu_llama_small; do
  if $own; then rm -f "$cal"; fi  # no fits carried from another model
  calibrate "$cfg"
  for n in 4 8; do
    if $own; then
      echo "== fit and verify $cfg n=$n"
      fit=(--fit 16)
    else
      echo "== verify $cfg n=$n"
      fit=()
    fi
    $B plan --config "configs/plan/$cfg.json" --devices "$n" --device cpu --calibration "$cal" \
      "${fit[@]}" --verify 6 --verify-steps 6
  done
done
