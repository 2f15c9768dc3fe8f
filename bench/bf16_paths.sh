#!/usr/bin/env bash
# bf16 against fp32 on this CPU, on each bf16 matmul path. (1) The products of bench-23M
# (B=8, T=256: 2048 rows) and gpt2-124M (B=4, T=64: 256 rows) one at a time (build/gemm_paths):
# oneDNN's fp32 sgemm, bf16 widened into a workspace for it, and pack_gemm on each micro-kernel
# this CPU runs; then the same with oneDNN held to AVX2 (DNNL_MAX_CPU_ISA=AVX2), as on a CPU with
# AVX2 only. (2) Whole training steps, fp32, bf16 on the detected path and bf16 forced onto the
# widened path (STRATA_BF16_MATMUL=widened, what a CPU without a bf16 dot product runs), in turn
# ROUNDS times; the summary gives medians over the rounds and bf16 / fp32. BEFORE=/path/to/strata
# adds a fourth run, that binary's bf16 on the widened path (an earlier commit, for an A/B).
#
#   bench/bf16_paths.sh | tee bench/results_bf16_$(date +%F).txt
#   ROUNDS=1 STEPS=2 bench/bf16_paths.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
gemm=${GEMM_PATHS:-$repo/build/gemm_paths}
rounds=${ROUNDS:-3}
steps=${STEPS:-5}
export OMP_NUM_THREADS=${THREADS:-2}
machine_info --strata "$strata" --layout "1 rank x $OMP_NUM_THREADS threads"

# M N K ta tb [c acc]: forward (x · wᵀ), input gradient (dy · w), weight gradient (dyᵀ · x, fp32 +=)
shapes_23m=("2048 1536 512 0 1" "2048 512 2048 0 1" "2048 8192 512 0 1" "2048 512 1536 0 0"
  "2048 2048 512 0 0" "1536 512 2048 1 0 fp32 1" "512 2048 2048 1 0 fp32 1")
shapes_124m=("256 2304 768 0 1" "256 768 3072 0 1" "256 768 2304 0 0" "2304 768 256 1 0 fp32 1")
echo "## products, GFLOP/s (median of 9)"
for s in "${shapes_23m[@]}" "${shapes_124m[@]}"; do "$gemm" $s; done
echo "## the same with oneDNN held to AVX2"
for s in "${shapes_23m[@]}" "${shapes_124m[@]}"; do DNNL_MAX_CPU_ISA=AVX2 "$gemm" $s; done

step_of() { awk '/^bench model=/ { for (i = 1; i <= NF; ++i) if ($i ~ /^step_s=/) { sub("step_s=", "", $i); print $i } }'; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for model in "bench-23M" "gpt2-124M -b 4 -t 64"; do
  echo "## $model: fp32, bf16 (detected path), bf16 widened; $rounds rounds of $steps steps"
  declare -A t=()
  for r in $(seq "$rounds"); do
    for run in fp32 bf16 widened ${BEFORE:+before}; do
      dt=$run path= bin=$strata
      [ "$run" = widened ] && dt=bf16 path=widened
      [ "$run" = before ] && dt=bf16 path=widened bin=$BEFORE
      out=$(STRATA_BF16_MATMUL=$path "$bin" bench --model $model --dtype "$dt" \
        --steps "$steps" 2>&1 | grep -E '^(bench model|cpu|MFU)')
      echo "# round $r, $run"
      echo "$out"
      t[$run]="${t[$run]:-} $(step_of <<<"$out")"
    done
  done
  f=$(median <<<"${t[fp32]}") b=$(median <<<"${t[bf16]}") w=$(median <<<"${t[widened]}")
  echo "summary $model: median step fp32 ${f}s, bf16 ${b}s, bf16 widened ${w}s;" \
    "bf16 speed / fp32: $(awk -v f="$f" -v b="$b" 'BEGIN { printf "%.2f", f / b }')," \
    "widened: $(awk -v f="$f" -v b="$w" 'BEGIN { printf "%.2f", f / b }')"
  if [ -n "${BEFORE:-}" ]; then
    o=$(median <<<"${t[before]}")
    echo "summary $model: before ($BEFORE) bf16 widened ${o}s, / fp32:" \
      "$(awk -v f="$f" -v b="$o" 'BEGIN { printf "%.2f", f / b }')"
  fi
  unset t
done
