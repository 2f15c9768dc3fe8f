#!/usr/bin/env bash
# DeepSpeed ZeRO stages 0-3 on CPU (gloo), 2 ranks x 1 thread, micro batch 4, bench-23M model:
# the ZeRO peer of `strata launch -n 2`. One launch per stage so peak RSS is per stage.
#   PYTHON=/tmp/tv/bin/python bash bench/deepspeed_peer.sh            # all four stages
#   STAGES="2 3" STEPS=10 WARMUP=3 bash bench/deepspeed_peer.sh
# Needs deepspeed in $PYTHON's environment:  DS_BUILD_OPS=0 $PYTHON -m pip install deepspeed
# (the first run JIT-compiles DeepSpeed's small shm comm op with g++ into ~/.cache/torch_extensions).
set -euo pipefail
PYTHON=${PYTHON:-/tmp/tv/bin/python}
STAGES=${STAGES:-0 1 2 3}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
here=$(cd "$(dirname "$0")" && pwd)
if ! "$PYTHON" -c "import deepspeed" >/dev/null 2>&1; then
    echo "deepspeed is not importable by $PYTHON; install it with: DS_BUILD_OPS=0 $PYTHON -m pip install deepspeed" >&2
    exit 1
fi
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DS_BUILD_OPS=0
for s in $STAGES; do
    log=$(mktemp)
    if ! "$PYTHON" "$here/deepspeed_peer.py" --stage "$s" --ranks 2 --threads 1 --batch 4 \
            --warmup "$WARMUP" --steps "$STEPS" "$@" >"$log" 2>&1; then
        echo "deepspeed stage=$s FAILED:" >&2
        tail -30 "$log" >&2
        rm -f "$log"
        exit 1
    fi
    grep '^deepspeed stage=' "$log"
    rm -f "$log"
done
