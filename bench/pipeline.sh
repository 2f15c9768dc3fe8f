#!/usr/bin/env bash
# Pipeline parallelism on 2 ranks: every schedule at pp 2 against pp 1 (dp 2 on the same ranks)
# and one rank with both cores, the same global batch (8 sequences of bench-23M: B=1 x 8
# micro-batches). Prints step time, tokens/s, the activation bytes the tracker saw per rank (the
# micro-batches each schedule keeps in flight), and the bubble: measured from every rank's action
# trace of each step (1 - compute / (ranks x the step's span)) against the checker's simulation
# of the same schedule with the measured action times (pipeline/schedule_check.h).
#
#   bench/pipeline.sh | tee bench/results_pp_$(date +%F).txt
#   MODEL=bench-23M STEPS=3 DTYPES=fp32 STRATA=build/strata bench/pipeline.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
model=${MODEL:-bench-23M}
steps=${STEPS:-3}
read -r -a dts <<<"${DTYPES:-fp32}"
machine_info --strata "$strata" --layout "1 rank x 2 threads; 2 ranks x 1 thread"
bench=(bench --model "$model" -b 1 --steps "$steps" --dtype "${dts[@]}")
echo "## 1 rank, pp 1, 8 micro-batches"
OMP_NUM_THREADS=2 "$strata" "${bench[@]}" --micro 8 2>&1 | grep '^bench'
echo "## 2 ranks, dp 2, 4 micro-batches each"
"$strata" launch -n 2 -- "${bench[@]}" --micro 4 2>&1 | grep '^bench'
for schedule in gpipe 1f1b zero_bubble; do
  echo "## 2 ranks, pp 2, $schedule, 8 micro-batches"
  "$strata" launch -n 2 -- "${bench[@]}" --micro 8 --pipeline 2 --schedule "$schedule" 2>&1 |
    grep '^bench'
done
echo "## 2 ranks, pp 2, interleaved, 2 virtual stages, 8 micro-batches"
"$strata" launch -n 2 -- "${bench[@]}" --micro 8 --pipeline 2 --schedule interleaved --virtual 2 \
  2>&1 | grep '^bench'
