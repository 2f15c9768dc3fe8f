#!/usr/bin/env bash
# The live progress line (core/progress.h): on a terminal (a pseudo-terminal from script(1)) the
# training's line is rewritten in place with its ETA, the log lines print above it, and a
# checkpoint save shows its bytes; with stdout to a file there is no drawing, only the log lines,
# which carry the ETA; STRATA_PROGRESS overrides; ranks under strata launch draw only when launch
# itself would.
#
#   tests/monitor/progress_test.sh STRATA_BINARY
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/strata-progress.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 TERM=xterm
python3 "$here/monitor_peer.py" data "$work"
cat >"$work/c.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 5,
 "model": {"preset": "gpt2-tiny"}, "checkpoint": {"dir": "$work/ck", "interval": 3}}
JSON
args="train --config $work/c.json --data $work/train.bin --steps 6 --run-dir $work/r"
train="$strata $args"
fail() { echo "FAIL: $*"; exit 1; }
cr=$'\r' esc=$'\x1b[K'

unset STRATA_PROGRESS
script -qec "$train" /dev/null >"$work/tty.out"
out=$(cat "$work/tty.out")
for want in "${cr}step 6/6 | loss " "| ETA " "$esc" "${cr}checkpoint save (this rank's file): " \
            "step     5/6 | loss"; do
  [[ $out == *"$want"* ]] || fail "terminal output lacks '$want'"
done
# The log line of step 5 came out on a cleared line, not after the live text.
[[ $out == *"${cr}${esc}step     5/6 |"* ]] || fail "step 5's log line does not clear the live line"
grep -q "^done: 6 steps" <(tr -d '\r' <"$work/tty.out") || fail "no 'done' line of its own"

$train >"$work/file.out"
grep -q $'\r' "$work/file.out" && fail "drawing into a file"
grep -q "^step     5/6 | .* | ETA " "$work/file.out" || fail "no ETA on the log lines"

STRATA_PROGRESS=lines script -qec "$train" /dev/null >"$work/tty2.out"
grep -q "step 6/6 |" "$work/tty2.out" && fail "STRATA_PROGRESS=lines still draws"
STRATA_PROGRESS=live $train >"$work/live.out"
grep -q "step 6/6 |" "$work/live.out" || fail "STRATA_PROGRESS=live does not draw"

# strata launch: its own stdout decides for the ranks; rank 1 never draws.
script -qec "$strata launch -n 2 -- $args" /dev/null >"$work/launch_tty.out"
grep -q "step 6/6 |" "$work/launch_tty.out" || fail "launch on a terminal: no live line"
$strata launch -n 2 -- $args >"$work/launch_file.out"
grep -q $'\r' "$work/launch_file.out" && fail "launch into a file: drawing"
[ "$(grep -c "^step     5/6" "$work/launch_file.out")" = 1 ] || fail "one rank logs"
echo "progress test: passed"
