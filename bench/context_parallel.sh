#!/usr/bin/env bash
# Context parallelism on bench-23M (issue: long sequences): activations per rank against T/cp,
# cp 2 against dp 2 at the same global batch, and one long sequence with and without cp.
# Usage: bench/context_parallel.sh [BUILD_DIR] > bench/results_context_<date>.txt
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=$(cd "${1:-build}" && pwd)/strata
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
machine_info --strata "$B" --layout "1, 2 or 4 ranks on the host's cores (threads = cores / ranks)"
run() {  # ranks, then bench arguments
  local n=$1
  shift
  echo "## launch -n $n -- bench $*"
  $B launch -n "$n" -- bench --dtype fp32 "$@" 2>&1 | grep -E '^bench model|^bench activations|^bench tp' || true
}
echo "### 1. activations per rank at T 4096, one sequence: T/cp rows each"
run 1 -b 1 -t 4096 --steps 2 --warmup 1
run 2 -b 1 -t 4096 --steps 2 --warmup 1 --context 2 --context-impl ulysses
run 2 -b 1 -t 4096 --steps 2 --warmup 1 --context 2 --context-impl ring
run 4 -b 1 -t 4096 --steps 2 --warmup 1 --context 4 --context-impl ulysses
run 4 -b 1 -t 4096 --steps 2 --warmup 1 --context 4 --context-impl ring
echo "### 2. the same global batch (2 sequences of 4096) on 2 ranks: dp 2 against cp 2"
run 2 -b 1 -t 4096 --steps 3 --warmup 1
run 2 -b 2 -t 4096 --steps 3 --warmup 1 --context 2 --context-impl ulysses
run 2 -b 2 -t 4096 --steps 3 --warmup 1 --context 2 --context-impl ring
echo "### 3. one sequence of 16384"
run 1 -b 1 -t 16384 --steps 1 --warmup 0
run 2 -b 1 -t 16384 --steps 1 --warmup 0 --context 2 --context-impl ring
