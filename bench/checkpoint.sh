#!/usr/bin/env bash
# Checkpoint save and load speed against the disk: gpt2-124M, bf16 with fp32 master weights and
# Adam moments (12 bytes per parameter stored), dp 4 with ZeRO-1 (each rank writes and reads its
# quarter), one training step, then a save (`checkpoint:` line) and, in a new job, a load
# (`resumed from` line). The baseline is a plain sequential write of the same number of bytes with
# dd (fsync at the end, as the save fsyncs) and a sequential read of that file. Before every read
# the files' pages are dropped from the page cache (dd iflag=nocache count=0), so both reads come
# from the disk. ROUNDS rounds, medians.
#
#   bench/checkpoint.sh | tee bench/results_checkpoint_$(date +%F).txt
#   DIR=/tmp/ckbench ROUNDS=3 STRATA=build/strata bench/checkpoint.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
dir=${DIR:-/tmp/strata_ckbench}
rounds=${ROUNDS:-3}
machine_info --strata "$strata" --layout "4 ranks x 1 thread"
echo "# disk: $(df -h "$(dirname "$dir")" | tail -1)"
rm -rf "$dir"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
cat >"$dir/config.json" <<EOF
{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": 1},
 "model": {"preset": "gpt2-124M", "seq_len": 64}}
EOF
drop() { for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none; done; }
seconds() { sed -E 's/.*\(([0-9.]+) s\)$/\1/'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
saves=() loads=() writes=() reads=() load_reads=()
for r in $(seq "$rounds"); do
  rm -rf "$dir/ckpt" "$dir/run" "$dir/seq.bin"
  out=$("$strata" launch -n 4 -- train --config "$dir/config.json" --steps 1 --run-dir "$dir/run" \
    --set "checkpoint.dir=\"$dir/ckpt\"" 2>&1)
  save=$(grep '^checkpoint:' <<<"$out" | seconds)
  step=$(cat "$dir/ckpt/latest")
  bytes=$(du -sb "$dir/ckpt/$step" | cut -f1)
  drop "$dir/ckpt/$step"/*
  out=$("$strata" launch -n 4 -- train --config "$dir/config.json" --steps 1 --run-dir "$dir/run" \
    --set "checkpoint.dir=\"$dir/ckpt2\"" --resume "$dir/ckpt" 2>&1)
  load=$(grep '^resumed from' <<<"$out" | seconds)
  load_read=$(grep '^resumed from' <<<"$out" | sed -E 's/.*\(read ([0-9.]+) s\).*/\1/')
  t0=$(date +%s.%N)
  dd if=/dev/zero of="$dir/seq.bin" bs=16M count=$(((bytes + 16777215) / 16777216)) conv=fsync \
    status=none
  t1=$(date +%s.%N)
  drop "$dir/seq.bin"
  t2=$(date +%s.%N)
  dd if="$dir/seq.bin" of=/dev/null bs=16M status=none
  t3=$(date +%s.%N)
  write=$(echo "$t1 - $t0" | bc -l)
  read=$(echo "$t3 - $t2" | bc -l)
  printf 'round %d: %s bytes; save %.2f s, dd write %.2f s; load %.2f s (of which reading %.2f s), dd read %.2f s\n' \
    "$r" "$bytes" "$save" "$write" "$load" "$load_read" "$read"
  saves+=("$save") loads+=("$load") writes+=("$write") reads+=("$read") load_reads+=("$load_read")
done
mb() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.0f MB/s", b / s / 1e6 }'; }
s=$(printf '%s\n' "${saves[@]}" | median)
w=$(printf '%s\n' "${writes[@]}" | median)
l=$(printf '%s\n' "${loads[@]}" | median)
lr=$(printf '%s\n' "${load_reads[@]}" | median)
d=$(printf '%s\n' "${reads[@]}" | median)
echo "## medians over $rounds rounds ($bytes bytes: fp32 master + 2 Adam moments of gpt2-124M)"
printf 'save %.2f s (%s) vs sequential write %.2f s (%s): %.2fx of the disk\n' \
  "$s" "$(mb "$s")" "$w" "$(mb "$w")" "$(echo "$w / $s" | bc -l)"
printf 'load %.2f s (%s) vs sequential read %.2f s (%s): %.2fx of the disk\n' \
  "$l" "$(mb "$l")" "$d" "$(mb "$d")" "$(echo "$d / $l" | bc -l)"
printf 'load, checks and reads only (without publishing and ZeRO-1 re-gathering the bf16 '
printf 'parameters) %.2f s (%s): %.2fx of the disk\n' "$lr" "$(mb "$lr")" "$(echo "$d / $lr" | bc -l)"
