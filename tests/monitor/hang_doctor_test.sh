#!/usr/bin/env bash
# Hangs explained (comm/flight_recorder.h, `strata doctor`): one rank of a 4-rank job stops alive
# on purpose (--fault phase=hang|hang-forward|hang-backward) under data, tensor, pipeline and
# expert parallelism. The others' watchdogs (parallelism.timeout_s = 6) end the job; every rank must
# have left its flight record, and `strata doctor` must name the stopped rank, its grid place and
# what it was doing, and the operation the others wait in (under expert parallelism: the MoE
# layer's all-to-all on the ep group). A second hang in the same run
# directory keeps the first one's records (flight.1); bad doctor input is an error (exit 2).
#
#   tests/monitor/hang_doctor_test.sh STRATA_BINARY
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/strata-hang.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
python3 "$here/monitor_peer.py" data "$work"
fail() { echo "FAIL: $*"; exit 1; }

# A mixture of experts whose 4 experts are spread over the 4 ranks (parallelism.expert).
moe='{"family": "mixtral", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn_hidden": 48,
      "vocab": 64, "seq_len": 16, "moe": {"experts": 4, "top_k": 2}}'

check() {  # name, tensor, pipeline, stopped rank, its place, fault phase, what the others wait in
           # [, the model block, the expert-parallel size]
  local name=$1 tp=$2 pp=$3 rank=$4 place=$5 phase=$6 waited=$7
  local model=${8:-'{"preset": "gpt2-tiny"}'} ep=${9:-1}
  cat >"$work/$name.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 100,
 "model": $model,
 "parallelism": {"tensor": $tp, "pipeline": $pp, "expert": $ep, "timeout_s": 6}}
JSON
  local start=$SECONDS
  if "$strata" launch -n 4 -- train --config "$work/$name.json" --data "$work/train.bin" \
      --steps 5 --run-dir "$work/$name" --fault "rank=$rank,step=3,phase=$phase" \
      >"$work/$name.log" 2>&1; then
    fail "$name: the hung job exited 0"
  fi
  [ $((SECONDS - start)) -lt 90 ] || fail "$name: the watchdog took $((SECONDS - start)) s"
  grep -q "waited more than 6 s" "$work/$name.log" || { cat "$work/$name.log"; fail "$name: no watchdog"; }
  for r in 0 1 2 3; do
    [ -s "$work/$name/flight/rank$r.json" ] || fail "$name: no flight record of rank $r"
  done
  "$strata" doctor "$work/$name" >"$work/$name.doctor" 2>&1 || { cat "$work/$name.doctor"; fail "$name: doctor failed"; }
  cat "$work/$name.doctor"
  grep -q "^flight records of 4 of 4 ranks$" "$work/$name.doctor" || fail "$name: records"
  grep -q "^diagnosis: rank $rank ($place on [^)]*) stopped at step 3 in \"injected hang ($phase)\" for [0-9.]* s: it holds the job$" \
    "$work/$name.doctor" || fail "$name: rank $rank not named"
  grep -q "^ranks\? [0-9, and]* waits\? in $waited" "$work/$name.doctor" || fail "$name: no wait in $waited"
  grep -q "^rank $rank ($place on [^)]*) never reached what .* in: it is in no communication" \
    "$work/$name.doctor" || fail "$name: rank $rank's state"
  echo "$name: rank $rank named"
}

check dp4 1 1 2 "dp 2 tp 0 pp 0" hang "dp all_reduce #"
check tp2 2 1 1 "dp 0 tp 1 pp 0" hang-forward "tp all_reduce #"
check pp2 1 2 3 "dp 1 tp 0 pp 1" hang-backward "pp-p2p recv #[0-9]* from rank 3"
# The experts' group: the others wait in the MoE layer's count exchange over ep.
check ep4 1 1 2 "dp 2 tp 0 pp 0" hang-forward "ep all_to_all #" "$moe" 4

# A second hang in the same run directory: the first one's records move to flight.1.
first=$(cat "$work/pp2/flight/rank0.json")
"$strata" launch -n 4 -- train --config "$work/pp2.json" --data "$work/train.bin" --steps 5 \
  --run-dir "$work/pp2" --fault "rank=0,step=2,phase=hang-forward" >"$work/again.log" 2>&1 &&
  fail "second hang exited 0"
[ "$(cat "$work/pp2/flight.1/rank0.json")" = "$first" ] || fail "the first records were not kept"
"$strata" doctor "$work/pp2/flight.1" | grep -q "^diagnosis: rank 3 " || fail "doctor on flight.1"
"$strata" doctor "$work/pp2" | grep -q "^diagnosis: rank 0 .* at step 2 in \"injected hang (hang-forward)\"" ||
  fail "doctor on the second hang"

# Bad input: exit 2 with the reason.
set +e
"$strata" doctor "$work/nowhere" >"$work/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "is not a directory" "$work/bad.log" || { cat "$work/bad.log"; fail "missing dir"; }
mkdir "$work/empty"
"$strata" doctor "$work/empty" >"$work/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "no flight records" "$work/bad.log" || { cat "$work/bad.log"; fail "empty dir"; }
head -c 100 "$work/dp4/flight/rank1.json" >"$work/dp4/flight/rank1.json.cut"
mv "$work/dp4/flight/rank1.json.cut" "$work/dp4/flight/rank1.json"
"$strata" doctor "$work/dp4" >"$work/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "rank1.json is not valid JSON" "$work/bad.log" || { cat "$work/bad.log"; fail "cut record"; }
set -e
echo "hang doctor test: passed"
