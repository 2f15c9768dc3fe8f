#!/usr/bin/env bash
# Data parallelism on this machine, side by side in one run (bench-23M, fp32, global batch 8):
#   - strata 1 rank x 2 threads against 2 ranks x 1 thread (scaling efficiency);
#   - overlap_comm on and off with 10 MB buckets: the communication time left exposed after
#     backward;
#   - PyTorch DDP (gloo) on the same model and ranks (bench/ddp_peer.py);
#   - collective bandwidth of strata's Communicator against raw MPI (comm_bandwidth).
# PYTHON picks the PyTorch (default pip's, /tmp/peer-venv/bin/python, from bench/setup_peers.sh;
# Debian's /usr/bin/python3 runs with OPENBLAS_CORETYPE from the CPU); STRATA the binary
# (default build/strata; its comm_bandwidth is taken from the same directory).
#   STRATA=build/strata PYTHON=/tmp/peer-venv/bin/python STEPS=5 bench/dp_scaling.sh | tee bench/results_dp_$(date +%F).txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
py=${PYTHON:-/tmp/peer-venv/bin/python}
steps=${STEPS:-5}
strata=${STRATA:-$repo/build/strata}
[ -x "$strata" ] || [ -n "${STRATA:-}" ] || "$repo/scripts/setup.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE  # never for strata
peer() {  # threads-per-process, then ddp_peer.py arguments
  local t=$1; shift
  if [ "$py" = /usr/bin/python3 ]; then
    # shellcheck disable=SC2046
    env $(debian_torch_env "$t") "$py" "$here/ddp_peer.py" --threads "$t" "$@"
  else
    env OMP_NUM_THREADS="$t" MKL_NUM_THREADS="$t" "$py" "$here/ddp_peer.py" --threads "$t" "$@"
  fi
}
echo "# STRATA=$strata PYTHON=$py STEPS=$steps bench/dp_scaling.sh"
machine_info --strata "$strata" --python "$py" \
  --layout "1 rank x 2 threads and 2 ranks x 1 thread, both sides (strata OMP_NUM_THREADS / launch --threads; PyTorch torch.set_num_threads)"

echo "## strata: 1 rank x 2 threads vs 2 ranks x 1 thread"
OMP_NUM_THREADS=2 "$strata" bench --model bench-23M --dtype fp32 -b 8 --steps "$steps"
for overlap in on off; do
  "$strata" launch -n 2 --threads 1 -- bench --model bench-23M --dtype fp32 -b 4 \
    --steps "$steps" --overlap "$overlap" --bucket 2500000
done
echo "## PyTorch DDP (gloo), 2 ranks x 1 thread, batch 4 per rank"
peer 1 --ranks 2 --batch 4 --steps "$steps"
echo "## PyTorch, 1 process x 2 threads, batch 8"
peer 2 --ranks 1 --batch 8 --steps "$steps"
echo "## collectives: strata vs raw MPI, 2 ranks"
if [ -x "$(dirname "$strata")/comm_bandwidth" ]; then
  mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$(dirname "$strata")/comm_bandwidth"
else
  echo "(no comm_bandwidth beside $strata: cmake --build $(dirname "$strata") --target comm_bandwidth)"
fi
