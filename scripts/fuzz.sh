#!/usr/bin/env bash
# Builds every libFuzzer target in fuzz/ and runs each for a fixed time; exits non-zero if any
# finds something: a crash, an AddressSanitizer or UndefinedBehaviorSanitizer report, an
# exception escaping the target, a leak, a timeout or running out of memory.
#
#   scripts/fuzz.sh [SECONDS] [NAME...]     SECONDS per target (default 60); NAMEs: only these
#
# A target is fuzz/<name>_fuzz.cc defining
#   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
# with, near its top, a line naming the strata sources it links (paths from the repository root):
#   // fuzz-sources: src/strata/core/safetensors.cc src/strata/core/check.cc
# and, if it needs them, one with more compiler or linker flags:
#   // fuzz-flags: -fopenmp
# To add a target, drop such a file in fuzz/; nothing here changes. Optional: seed inputs in
# fuzz/corpus/<name>/ (small files, checked in) and a libFuzzer dictionary fuzz/<name>.dict.
#
# Needs clang++ with libFuzzer (FUZZ_CXX overrides the compiler). Builds with
# -fsanitize=fuzzer,address,undefined and UBSan reports fatal, into build-fuzz/. The inputs a run
# discovers collect in build-fuzz/corpus/<name>/ and seed the next run; a finding is saved as
# build-fuzz/findings/<name>/crash-<sha1> (or leak-, timeout-, oom-); reproduce it with
#   build-fuzz/<name>_fuzz build-fuzz/findings/<name>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift $(($# > 0 ? 1 : 0))
cxx=${FUZZ_CXX:-clang++}
out=build-fuzz
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (set FUZZ_CXX)" >&2; exit 2; }

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cc; do
    n=$(basename "$f" _fuzz.cc)
    names+=("$n")
  done
fi

# The value of a "// fuzz-<key>:" line of a target's source.
directive() { sed -n "s|^// fuzz-$2:[[:space:]]*||p" "$1" | head -n 1; }

mkdir -p "$out"
failed=()
summary=()
for name in "${names[@]}"; do
  src=fuzz/${name}_fuzz.cc
  [ -f "$src" ] || { echo "fuzz.sh: no $src" >&2; exit 2; }
  sources=$(directive "$src" sources)
  flags=$(directive "$src" flags)
  bin=$out/${name}_fuzz
  echo "=== $name: building $bin"
  # shellcheck disable=SC2086  # the directive lists are word lists
  "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer -Wall -Wextra \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Isrc -I. -o "$bin" "$src" $sources $flags

  corpus=$out/corpus/$name
  findings=$out/findings/$name
  mkdir -p "$corpus" "$findings"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$findings/")
  [ -f "fuzz/$name.dict" ] && args+=(-dict="fuzz/$name.dict")
  seeds=()
  [ -d "fuzz/corpus/$name" ] && seeds+=("fuzz/corpus/$name")
  log=$out/$name.log
  echo "=== $name: fuzzing for ${seconds} s (log $log)"
  set +e
  UBSAN_OPTIONS=print_stacktrace=1 "$bin" "${args[@]}" "$corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  if [ $rc -eq 0 ]; then
    summary+=("$name: ok, ${runs:-?} runs, ${cov:-cov: ?}, corpus $(find "$corpus" -type f | wc -l) inputs")
  else
    failed+=("$name")
    summary+=("$name: FINDING (exit $rc) after ${runs:-?} runs; see $log and $findings/")
    tail -n 40 "$log"
  fi
done

echo "=== fuzz summary"
printf '  %s\n' "${summary[@]}"
[ ${#failed[@]} -eq 0 ]
