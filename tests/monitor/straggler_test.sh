#!/usr/bin/env bash
# Stragglers (monitor/stragglers.h): one rank made slow on purpose (--slow: busy work before each
# of its forwards) under data, tensor and pipeline parallelism at 4 ranks. The log must name that
# rank, and no other, with its grid place and the forward as the phase it loses in; every window's
# metrics.jsonl row must carry the per-phase statistics with that rank slowest in busy time, and
# every rank's step and busy time (per_rank) with that rank's the largest. The slowness (0.1 s a
# forward, two to four forwards a step) is several times a step of this tiny model, so that a slower build
# (a sanitizer's, a loaded machine) still sees it; the rank may be named after any two windows in
# a row (the first window holds the warm-up, which can hide it there).
#
#   tests/monitor/straggler_test.sh STRATA_BINARY
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/strata-straggler.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
python3 "$here/monitor_peer.py" data "$work"
fail() { echo "FAIL: $*"; exit 1; }

check() {  # name, slow rank, its place, parallelism block
  local name=$1 slow=$2 place=$3 par=$4
  cat >"$work/$name.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 100,
 "model": {"preset": "gpt2-tiny"}, "parallelism": $par,
 "train": {"straggler_interval": 3, "straggler_patience": 2}}
JSON
  "$strata" launch -n 4 -- train --config "$work/$name.json" --data "$work/train.bin" --steps 12 \
    --run-dir "$work/$name" --slow "$slow:0.1" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "$name: the run failed"; }
  grep -Eq "^straggler: rank $slow \($place on .*\) busy .* for 2 windows of 3 steps in a row, steps (4-6|7-9|10-12); most in forward_s" \
    "$work/$name.log" || { grep straggler "$work/$name.log"; fail "$name: rank $slow not named"; }
  if grep "^straggler: rank" "$work/$name.log" | grep -vq "^straggler: rank $slow "; then
    grep straggler "$work/$name.log"; fail "$name: another rank named"
  fi
  python3 - "$work/$name/metrics.jsonl" "$slow" <<'PY' || fail "$name: metrics.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
windows = [r for r in rows if "stragglers" in r]
assert [r["step"] for r in windows] == [3, 6, 9, 12], [r["step"] for r in windows]
for r in windows:
    st = r["stragglers"]
    busy = st["per_step"]["busy_s"]
    assert busy["slowest_rank"] == int(sys.argv[2]), st
    assert busy["min"] <= busy["median"] <= busy["max"], busy
    assert set(st["per_step"]) >= {"forward_s", "backward_s", "comm_exposed_s",
                                   "pipeline_wait_s", "optimizer_s", "busy_s"}, st
    assert int(sys.argv[2]) in st["slow_ranks"], st
    per_rank = st["per_rank"]
    assert len(per_rank["step_time_s"]) == 4 and len(per_rank["busy_s"]) == 4, per_rank
    assert max(range(4), key=lambda q: per_rank["busy_s"][q]) == int(sys.argv[2]), per_rank
    assert abs(max(per_rank["busy_s"]) - busy["max"]) < 1e-12, (per_rank, busy)
PY
  echo "$name: rank $slow named"
}

check dp4 2 "dp 2 tp 0 pp 0" '{"tensor": 1, "pipeline": 1}'
check tp2 1 "dp 0 tp 1 pp 0" '{"tensor": 2, "pipeline": 1}'
check pp2 3 "dp 1 tp 0 pp 1" '{"tensor": 1, "pipeline": 2}'
echo "straggler test: passed"
