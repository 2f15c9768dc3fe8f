#!/usr/bin/env bash
# Elastic restarts: for each injection point, rank 1 of 4 is killed (SIGKILL) in that phase of
# step 10 of a 12-step run of the demo model (fp32, 4 ranks x 1 thread, checkpoint every 5 steps);
# `strata launch --elastic` restarts on 3 ranks with the global batch kept. Reported from the
# supervisor's <run_dir>/elastic.jsonl: time to detect (the rank's last word before the kill to
# the supervisor knowing), time to restart (detection to the first step completed after the
# restart: stop, mpirun start, checkpoint load, one step), steps redone (completed steps after the
# checkpoint resumed from). Then the three-namespace host-cut test with its own row (its hosts
# share this machine's 2 cores).
#
#   bench/elastic.sh | tee bench/results_elastic_$(date +%F).txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
dir=$(mktemp -d /tmp/strata_elastic_bench_XXXXXX)
trap 'rm -rf "${dir:?}"' EXIT
machine_info --strata "$strata" --layout "4 ranks x 1 thread, then 3"
cat >"$dir/config.json" <<EOF
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 0,
 "model": {"preset": "demo"}, "checkpoint": {"interval": 5}}
EOF
echo
echo "| injection point | detect | restart | steps redone | whole run |"
echo "|---|---|---|---|---|"
for phase in forward backward reduce optimizer save; do
  rm -rf "${dir:?}/ckpt" "${dir:?}/run"
  t0=$(date +%s.%N)
  "$strata" launch --elastic -n 4 --fault "rank=1,step=10,phase=$phase" -- train \
    --config "$dir/config.json" --steps 12 --run-dir "$dir/run" \
    --set "checkpoint.dir=\"$dir/ckpt\"" >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; exit 1; }
  t1=$(date +%s.%N)
  python3 - "$dir/run/elastic.jsonl" "$phase" "$t0" "$t1" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
f = next(e for e in ev if e["event"] == "failure")
s = [e for e in ev if e["event"] == "start"][1]
r = next(e for e in ev if e["event"] == "running")
print("| %s, step 10 | %.3f s | %.2f s | %d (from step %d) | %.1f s |" % (
    sys.argv[2], f["detect_s"], r["restart_s"], f["last_step"] - s["resume_step"],
    s["resume_step"], float(sys.argv[4]) - float(sys.argv[3])))
PY
done
echo
echo "# host cut (tests/elastic/netns_hosts_test.sh): 3 namespaces x 2 ranks, tp 2, ZeRO-3,"
echo "# gpt2-tiny, heartbeat timeout 4 s, checkpoint every 10 steps, cut after step 15"
bash "$repo/tests/elastic/netns_hosts_test.sh" "$strata" --table | grep -v "^PASS"
