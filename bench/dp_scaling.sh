#!/usr/bin/env bash
# Data parallelism on this machine, side by side in one run (bench-23M, fp32, global batch 8):
#   - strata 1 rank x 2 threads against 2 ranks x 1 thread (scaling efficiency);
#   - overlap_comm on and off with 10 MB buckets: the communication time left exposed after
#     backward;
#   - PyTorch DDP (gloo) on the same model and ranks (bench/ddp_peer.py);
#   - collective bandwidth of strata's Communicator against raw MPI (comm_bandwidth).
# PYTHON picks the PyTorch (default Debian's /usr/bin/python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-/usr/bin/python3}
steps=${STEPS:-5}
strata=$repo/build/strata
[ -x "$strata" ] || "$repo/scripts/setup.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "## strata: 1 rank x 2 threads vs 2 ranks x 1 thread"
OMP_NUM_THREADS=2 "$strata" bench --model bench-23M --dtype fp32 -b 8 --steps "$steps"
for overlap in on off; do
  "$strata" launch -n 2 --threads 1 -- bench --model bench-23M --dtype fp32 -b 4 \
    --steps "$steps" --overlap "$overlap" --bucket 2500000
done
echo "## PyTorch DDP (gloo), 2 ranks x 1 thread, batch 4 per rank"
"$py" "$repo/bench/ddp_peer.py" --ranks 2 --threads 1 --batch 4 --steps "$steps"
echo "## PyTorch, 1 process x 2 threads, batch 8"
"$py" "$repo/bench/ddp_peer.py" --ranks 1 --threads 2 --batch 8 --steps "$steps"
echo "## collectives: strata vs raw MPI, 2 ranks"
mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$repo/build/comm_bandwidth"
