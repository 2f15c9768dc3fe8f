#!/usr/bin/env bash
# strata's TensorBoard and CSV monitors against the `tensorboard` package (PyPI, in the peer venv)
# as the reader: a run with both blocks enabled, one with validation, then a run resumed from its
# step-2 checkpoint. TensorBoard's EventAccumulator must read every tag with the values of
# metrics.jsonl at DeepSpeed's x axis (samples), the resumed event file must start with a
# SessionLog START past the kept samples, and the CSV files must hold DeepSpeed's layout with one
# row per step after the resume. Exits 77 (skip) when the venv cannot be made, e.g. without
# network.
#
#   tests/monitor/monitor_peer_test.sh STRATA_BINARY
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=$("$root/scripts/peer_venv.sh" tensorboard) || exit 77
work=$(mktemp -d /tmp/strata-monitor-peer.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2

"$py" "$here/monitor_peer.py" data "$work"
cat >"$work/config.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "model": {"preset": "gpt2-tiny"},
 "train": {"seed": 3, "eval_interval": 2, "eval_iters": 2},
 "data": {"val_path": "$work/val.bin"},
 "checkpoint": {"dir": "$work/ckpt", "interval": 2},
 "tensorboard": {"enabled": true, "output_path": "$work/tb", "job_name": "tiny"},
 "csv_monitor": {"enabled": true, "output_path": "$work/csv", "job_name": "tiny"}}
JSON
"$strata" train --config "$work/config.json" --data "$work/train.bin" --steps 4 \
  --run-dir "$work/run" >"$work/first.log"
grep -q "monitors: tensorboard: $work/tb/tiny/events.out.tfevents." "$work/first.log"
"$py" "$here/monitor_peer.py" check "$work" 4 first

# Resume from step 2: the steps 3 and 4 are trained and logged again.
step2=$(find "$work/ckpt" -mindepth 1 -maxdepth 1 -type d -name '*2' | sort | head -1)
[ -n "$step2" ]
sleep 1  # a new event file name (its time is in seconds)
"$strata" train --config "$work/config.json" --data "$work/train.bin" --steps 4 \
  --run-dir "$work/run" --resume "$step2" >"$work/second.log"
"$py" "$here/monitor_peer.py" check "$work" 4 resumed
echo "monitor peer test: passed"
