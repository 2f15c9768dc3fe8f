#!/usr/bin/env bash
# strata report end to end: the seed config (configs/seed_ds_config.json) trains 8 steps on one
# process with validation every 4 steps (4 steps, then resumed from their checkpoint), and on 2
# ranks (strata launch) with a straggler window every 2 steps. Each run directory must hold
# run.json with the config, layout and model (and the resumed step), and the 2-rank
# metrics.jsonl per-rank step times; `strata report` makes each into figures and a page,
# which headless Chromium renders: the screenshot must not be blank and must show the figures'
# colours. Bad input is refused with exit 2 and no report. Chromium is installed with apt-get
# where missing (root); the test is skipped (exit 77) where that cannot be done.
# REPORT_TEST_KEEP=DIR copies both reports and screenshots there (to look at them).
#
#   tests/report/report_chromium_test.sh STRATA_BINARY REPORT_PNG_CHECK
set -euo pipefail
strata=$(realpath "$1")
png_check=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "installing chromium (apt-get)"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
    } >/tmp/strata-report-apt.log 2>&1 || { tail -5 /tmp/strata-report-apt.log; echo "SKIP: chromium could not be installed"; exit 77; }
    browser=$(command -v chromium || true)
  fi
  [ -n "$browser" ] || { echo "SKIP: no chromium (apt-get install chromium)"; exit 77; }
fi

work=$(mktemp -d /tmp/strata-report.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

"$strata" data prepare --input /usr/share/common-licenses --output "$work/data/licences" \
  --val-fraction 0.05 >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; fail "data prepare"; }
train_args=(--config "$root/configs/seed_ds_config.json"
            --data "$work/data/licences_train.bin"
            --set "data.val_path=\"$work/data/licences_val.bin\""
            --set train.eval_interval=4 --set train.eval_iters=1 --set steps_per_print=4)
# One process: 4 steps with a checkpoint, then resumed to 8 (run.json rewritten, with the step).
ckpt=(--set "checkpoint.dir=\"$work/ckpt\"" --set checkpoint.interval=4)
"$strata" train "${train_args[@]}" "${ckpt[@]}" --steps 4 --run-dir "$work/one" >"$work/one.log" 2>&1 ||
  { cat "$work/one.log"; fail "1-process train"; }
python3 -c 'import json, sys; assert "resumed" not in json.load(open(sys.argv[1]))' \
  "$work/one/run.json" || fail "run.json of a fresh run says resumed"
"$strata" train "${train_args[@]}" "${ckpt[@]}" --steps 8 --resume auto --run-dir "$work/one" \
  >>"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1-process train, resumed"; }
"$strata" launch -n 2 -- train "${train_args[@]}" --steps 8 --run-dir "$work/two" \
  --set train.straggler_interval=2 >"$work/two.log" 2>&1 ||
  { cat "$work/two.log"; fail "2-rank train"; }

python3 - "$work" <<'PY' || fail "run.json / metrics.jsonl"
import json, sys
work = sys.argv[1]
for name, world in (("one", 1), ("two", 2)):
    run = json.load(open(f"{work}/{name}/run.json"))
    lay = run["layout"]
    assert lay["world_size"] == world and lay["dp"] == world, lay
    assert lay["zero_stage"] == 3 and lay["micro_batch"] == 1, lay
    assert lay["gradient_accumulation"] == 16, lay                     # the seed config's
    assert lay["train_batch_size"] == 16 * world, lay
    # Resumed without a model block, the model is the checkpoint's (named by its family).
    assert run["model"]["name"] == ("gpt2" if name == "one" else "demo"), run["model"]
    assert run["model"]["parameters"] > 0 and run["model"]["layers"] == 4, run["model"]
    params = params if "params" in dir() else run["model"]["parameters"]
    assert run["model"]["parameters"] == params, run["model"]
    assert run["model"]["dtype"] == "bf16", run["model"]
    assert run["config"]["zero_optimization"]["stage"] == 3, run["config"]
    assert run["config"]["train"]["steps"] == 8, run["config"]           # --steps, as an override
    assert run["command"][1:3] == ["train", "--config"], run["command"]
    assert run["model_line"].startswith("model %s: " % run["model"]["name"]), run["model_line"]
    assert run["cpu"] and run["started"].endswith("Z"), run
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8]
    windows = [r for r in rows if "stragglers" in r]
    if world == 1:
        assert not windows
        assert "ranks" not in run
        assert run["resumed"]["step"] == 4 and "/ckpt/" in run["resumed"]["from"], run
        assert run["config"]["train"]["steps"] == 8, run["config"]
    else:
        assert [r["step"] for r in windows] == [2, 4, 6, 8], [r["step"] for r in windows]
        for r in windows:
            pr = r["stragglers"]["per_rank"]
            assert len(pr["step_time_s"]) == 2 and len(pr["busy_s"]) == 2, pr
            assert all(v > 0 for v in pr["step_time_s"]), pr
        assert len(run["ranks"]) == 2, run
PY

for name in one two; do
  "$strata" report "$work/$name" >"$work/report-$name.log" 2>&1 ||
    { cat "$work/report-$name.log"; fail "strata report $name"; }
  grep -q "^report: 6 figures and index.html in $work/$name/report$" "$work/report-$name.log" ||
    { cat "$work/report-$name.log"; fail "report $name: its line"; }
  for f in loss throughput lr grad_norm memory rank_times; do
    [ -s "$work/$name/report/$f.png" ] || fail "$name: no $f.png"
    grep -q "<img src=\"$f.png\"" "$work/$name/report/index.html" || fail "$name: $f.png not linked"
  done
done
grep -q "single process: one rank, no per-rank times" "$work/one/report/index.html" ||
  fail "one: the per-rank figure does not say the run is one process"
grep -q "Each rank&#39;s seconds per step" "$work/two/report/index.html" ||
  fail "two: no per-rank figure"
grep -q "2 ranks = dp 2 x tp 1 x pp 1" "$work/two/report/index.html" || fail "two: no layout"

# Headless Chromium renders each page; the screenshot must show text and the figures' colours.
for name in one two; do
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --virtual-time-budget=5000 --window-size=1280,2000 --screenshot="$work/shot-$name.png" \
    "file://$work/$name/report/index.html" >"$work/chromium-$name.log" 2>&1 ||
    { tail -20 "$work/chromium-$name.log"; fail "chromium on $name"; }
  [ -s "$work/shot-$name.png" ] || { tail -20 "$work/chromium-$name.log"; fail "no screenshot"; }
  "$png_check" "$work/shot-$name.png" 0.02 2000 || fail "the $name page renders blank"
done

# Bad input: exit 2, the reason, nothing written.
set +e
"$strata" report "$work/missing" >"$work/bad.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || fail "a missing run directory: exit $rc"
grep -q "the run directory $work/missing does not exist" "$work/bad.log" || { cat "$work/bad.log"; fail "message"; }
mkdir "$work/nometrics"
set +e
"$strata" report "$work/nometrics" >"$work/bad.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "no metrics.jsonl in $work/nometrics" "$work/bad.log" ||
  { cat "$work/bad.log"; fail "no metrics.jsonl: exit $rc"; }
[ ! -e "$work/nometrics/report" ] || fail "a report was written for a run without metrics"

if [ -n "${REPORT_TEST_KEEP:-}" ]; then
  mkdir -p "$REPORT_TEST_KEEP"
  for name in one two; do
    rm -rf "${REPORT_TEST_KEEP:?}/$name"
    cp -r "$work/$name/report" "$REPORT_TEST_KEEP/$name"
    cp "$work/$name/run.json" "$REPORT_TEST_KEEP/$name/run.json"
    cp "$work/shot-$name.png" "$REPORT_TEST_KEEP/shot-$name.png"
  done
fi
echo "report chromium test: passed"
