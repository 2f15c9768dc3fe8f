#!/usr/bin/env bash
# strata against DeepSpeed ZeRO stages 0-3 on this machine, in one run (bench/zero_stages.py
# compare): bench-23M fp32, 2 ranks x 1 thread, micro-batch 4 per rank, the same
# zero_optimization settings given to both (printed; ZERO overrides keys), runs interleaved per
# stage (strata, DeepSpeed, strata, DeepSpeed, ... REPS each), each step split into compute,
# exposed communication and optimizer the same way on both sides (definitions printed in the
# output and in zero_stages.py), medians. Prints the machine header first.
#
#   bench/deepspeed_peer.sh | tee bench/results_zero_$(date +%F).txt
#   STRATA=build-x/strata PYTHON=/tmp/peer-venv/bin/python STAGES="2 3" REPS=3 STEPS=10 \
#     WARMUP=3 ZERO='{"overlap_comm": false}' bench/deepspeed_peer.sh
#
# PYTHON: an interpreter with torch and deepspeed (default /tmp/peer-venv/bin/python; installed
# there by bench/setup_peers.sh when missing: DS_BUILD_OPS=0 pip install deepspeed). The first
# DeepSpeed run JIT-compiles DeepSpeed's small shm comm op with g++ into ~/.cache/torch_extensions
# (a minute or two, once; not in any timed step). Extra arguments go to zero_stages.py compare.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
PYTHON=${PYTHON:-${PIP_TORCH_PYTHON:-/tmp/peer-venv/bin/python}}
STRATA=${STRATA:-$repo/build/strata}
STAGES=${STAGES:-0 1 2 3}
REPS=${REPS:-3}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
if ! DS_ACCELERATOR=cpu "$PYTHON" -c "import deepspeed" >/dev/null 2>&1; then
  echo "== deepspeed is not importable by $PYTHON: bench/setup_peers.sh" >&2
  PEER_VENV=$(dirname "$(dirname "$PYTHON")") "$here/setup_peers.sh" >&2
fi
# shellcheck disable=SC2086
exec python3 "$here/zero_stages.py" compare --python "$PYTHON" --strata "$STRATA" \
  --stages $STAGES --reps "$REPS" --steps "$STEPS" --warmup "$WARMUP" ${ZERO:+--zero "$ZERO"} "$@"
