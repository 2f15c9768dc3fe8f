#!/usr/bin/env bash
# Tensor and sequence parallelism on 2 ranks against tensor=1 (data parallelism) on the same 2
# ranks and against one rank with both cores: step time, the tensor-parallel collectives' time
# (all exposed: they block), the bytes they put on the wire against predict_tp_bytes (the
# formula, engine.h), and activation memory per rank from the tracking allocator.
#
#   bench/tensor_parallel.sh | tee bench/results_tp_$(date +%F).txt
#   MODEL=bench-23M B=8 STEPS=5 DTYPES="fp32 bf16" STRATA=build/strata bench/tensor_parallel.sh
#
# Per block, the formula is (f = (tp-1)/tp, X = B·T·hidden elements, b bytes each): without
# sequence parallelism 2 all-reduces forward and 2 backward = 8·f·X·b; with it an all-gather and
# a reduce-scatter per sublayer forward and 2 all-gathers and a reduce-scatter per sublayer
# backward = 10·f·X·b. The rest of the step's bytes are the embedding, the head, the
# vocabulary-parallel cross-entropy and (with SP) the replicated parameters' gradients.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
model=${MODEL:-bench-23M}
batch=${B:-8}
steps=${STEPS:-5}
dtypes=${DTYPES:-fp32 bf16}
machine_info --strata "$strata" --layout "1 rank x 2 threads; 2 ranks x 1 thread"
bench_args=(bench --model "$model" -b "$batch" --steps "$steps" --dtype)
read -r -a dts <<<"$dtypes"
bench_args+=("${dts[@]}")
echo "## 1 rank, tensor 1 (B=$batch)"
OMP_NUM_THREADS=2 "$strata" "${bench_args[@]}" 2>&1 | grep '^bench'
echo "## 2 ranks, tensor 1 = dp 2 (global batch $((2 * batch)))"
"$strata" launch -n 2 -- "${bench_args[@]}" 2>&1 | grep '^bench'
echo "## 2 ranks, tensor 2 (global batch $batch)"
"$strata" launch -n 2 -- "${bench_args[@]}" --tensor 2 2>&1 | grep '^bench'
echo "## 2 ranks, tensor 2, sequence parallel (global batch $batch)"
"$strata" launch -n 2 -- "${bench_args[@]}" --tensor 2 --sequence-parallel 2>&1 | grep '^bench'
